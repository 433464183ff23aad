#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fill a man page template with a daemon's configuration keys, in scdoc.

  cfg2scd.py TEMPLATE OUTPUT NAME=PROGRAM...

Every key of every daemon comes from one declarative table (ctrl/config_table.c,
kernels/worker/worker_cfg.c, dataplane/dp_cfg.c); the man pages take them
from the built programs, so they cannot drift from --help. A template line

  @options NAME@   becomes the program's flags, one entry each, under a
                   subheading per section (kvferry-ctrld(8) and friends);
  @keys NAME@      becomes its keys, with type, range, default, variable
                   and flag (kvferry.conf(5)).

The keys, sections, defaults and ranges are read from `PROGRAM
--print-config`, the types from `PROGRAM --help`; the help text is the same
in both.
"""
import os
import re
import subprocess
import sys


def run(prog, arg):
    # without KVFERRY_*: the build's environment must not show in the pages;
    # in a sanitizer build a leak report at exit must not fail the page
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVFERRY_")}
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    return subprocess.run([prog, arg], check=True, stdout=subprocess.PIPE, text=True, env=env).stdout


def keys(prog):
    """[{section, key, default, help, range, env, flag, type}] in --print-config order."""
    types = {}
    lines = run(prog, "--help").splitlines()
    for i, line in enumerate(lines[:-1]):
        m = re.match(r"^  (--[a-z0-9-]+) +\S", line)
        t = re.match(r"^\((.*); default '.*'; env \w+\)$", lines[i + 1].strip())
        if m and t:
            types[m.group(1)] = t.group(1)
    out, section, comment = [], None, []
    for line in run(prog, "--print-config").splitlines():
        m = re.match(r"^\[(\w+)\]$", line)
        k = re.match(r"^#([a-z0-9_]+) = (.*)$", line)
        if m:
            section, comment = m.group(1), []
        elif k and section and comment:
            meta = comment[-1]
            flag = re.search(r"flag (--[a-z0-9-]+)", meta).group(1)
            rng = re.search(r"range ([^;]+);", meta)
            out.append({"section": section, "key": k.group(1), "default": k.group(2),
                        "help": " ".join(comment[:-1]), "env": re.search(r"env (\w+)", meta).group(1),
                        "flag": flag, "type": types.get(flag, "a string"),
                        "range": rng.group(1).replace(" (K, M, G suffixes)", "") if rng else None})
            comment = []
        elif line.startswith("# ") and section:
            comment.append(line[2:])
        elif not line.strip():
            comment = []
    if not out:
        sys.exit("cfg2scd: %s --print-config listed no keys" % prog)
    return out


def esc(s):
    # scdoc: * and _ at a word's edge format; a backslash escapes them.
    return re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", s.replace("\\", "\\\\").replace("*", "\\*"))


def sentence(s):
    s = esc(s)
    return (s[:1].upper() + s[1:]).rstrip(".") + "." if s else ""


def value(k):
    return "_%s_" % esc(k["default"]) if k["default"] else "empty"


def metavar(t):
    if t.startswith("one of "):
        return "|".join("*%s*" % w for w in re.split(r", | or ", t[len("one of "):]))
    if t == "yes or no":
        return None
    return {"an integer": "_N_", "a number": "_X_"}.get(t, "_SIZE_" if t.startswith("a size") else "_VALUE_")


def by_section(ks, entry):
    out, section = [], None
    for k in ks:
        if k["section"] != section:
            section = k["section"]
            out.append("## [%s]\n" % section)
        out.append(entry(k))
    return "\n".join(out)


def option_entry(k):
    mv = metavar(k["type"])
    head = "*%s*, *--no-%s*" % (k["flag"], k["flag"][2:]) if mv is None else "*%s* %s" % (k["flag"], mv)
    return "%s\n\t%s Sets *%s* (default %s; *%s*).\n" % (head, sentence(k["help"]), esc(k["key"]), value(k),
                                                          k["env"])


def key_entry(k):
    t = k["type"] + ("; " + k["range"] if k["range"] else "")
    return "*%s* = %s\n\t%s\n\t(%s; *%s*, *%s*)\n" % (esc(k["key"]), value(k), sentence(k["help"]), esc(t),
                                                      k["env"], k["flag"])


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    progs = dict(a.split("=", 1) for a in sys.argv[3:])
    out = []
    for line in open(sys.argv[1], encoding="utf-8"):
        m = re.match(r"^@(options|keys) ([a-z-]+)@$", line.strip())
        if m:
            ks = keys(progs[m.group(2)])
            out.append(by_section(ks, option_entry if m.group(1) == "options" else key_entry))
        else:
            out.append(line)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write("".join(out))


if __name__ == "__main__":
    main()
