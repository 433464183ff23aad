#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the dashboard as headless Chromium rendered it (dashboard_chromium.sh).

    dashboard_check.py DOM.html SHOT.png STATS.json N_SERVED

DOM.html is `chromium --dump-dom` after the page's script ran, SHOT.png a
`--screenshot` of the same page, STATS.json /stats read right after (the
server is idle, so the occupancy it shows is the one the page showed), and
N_SERVED the requests the test had answered. Exits 1 naming each failure.

The bug this guards against: the occupancy bar was a <div> inside a <p>, which
the HTML parser moves out of the <p> (and so out of the bar): the bar stayed
empty and the fill landed on a line of its own. So the checks are made on what
the browser built and drew, not on the page's source: in the DOM the bar has
the fill as its child, at the occupancy's width; on the screen the fill's
pixels start at the bar's left edge, on the bar's rows, as wide as the
occupancy says.
"""
import html.parser
import json
import re
import struct
import sys
import zlib

BAR = (0xE8, 0xE8, 0xE8)   # .bar's background
FILL = (0x33, 0xAA, 0x77)  # .fill's background (#3a7)
BAR_PX = 240               # .bar's width
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.kids, self.text = tag, dict(attrs), parent, [], ""

    def classes(self):
        return (self.attrs.get("class") or "").split()

    def all(self):
        yield self
        for k in self.kids:
            yield from k.all()

    def text_all(self):
        return self.text + "".join(k.text_all() for k in self.kids)


class Tree(html.parser.HTMLParser):
    """The serialized DOM back as a tree (it is well formed: the browser wrote it)."""

    def __init__(self):
        super().__init__()
        self.root = Node("#root", [], None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.kids.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text += data


def png_rgb(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB/RGBA PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("%s is not a PNG" % path)
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                raise ValueError("PNG depth %d colour type %d: only 8-bit RGB(A) is read" % (depth, ctype))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def main():
    dom_path, png_path, stats_path, n_served = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    st = json.load(open(stats_path))
    occ = st["backend"]["replicas"][0]["occupancy"]
    fails = []
    if not 0.005 < occ < 0.995:
        fails.append("occupancy %.4f leaves nothing to see in a bar (the test's load is wrong)" % occ)

    t = Tree()
    t.feed(open(dom_path, encoding="utf-8").read())
    nodes = list(t.root.all())
    # the occupancy line: class "occ", or a <p> as the page once had it (so a
    # return of the bug fails on the bar, not on a missing class)
    occ_line = next((n for n in nodes if "occ" in n.classes()
                     or (n.tag == "p" and "pipeline occupancy" in n.text)), None)
    bars = [n for n in (occ_line.all() if occ_line else []) if "bar" in n.classes()]
    if occ_line is None or not bars:
        fails.append("no occupancy bar on the page (the script did not run, or /stats had no replica)")
    else:
        widths = [re.search(r"width:\s*([0-9.]+)%", k.attrs.get("style") or "") for k in bars[0].kids]
        widths = [float(m.group(1)) for m in widths if m]
        if not widths:
            fails.append("the occupancy bar has no fill inside it: %d element(s) in it (a <div> in a <p> "
                         "is moved out of the bar by the parser)" % len(bars[0].kids))
        elif abs(widths[0] - occ * 100) > 0.051:
            fails.append("the fill is %.1f%% wide, the occupancy is %.2f%%" % (widths[0], occ * 100))
    tps = next((n for n in nodes if n.attrs.get("id") == "tps"), None)
    if tps is None or not re.fullmatch(r"[0-9]+\.[0-9]", tps.text_all().strip()):
        fails.append("no generated tokens/s figure (#tps): %r" % (tps.text_all() if tps else None))
    ttft = next((n for n in nodes if n.attrs.get("id") == "lat-time_to_first_token_seconds"), None)
    cells = [c.text_all().strip() for c in ttft.kids if c.tag == "td"] if ttft else []
    if len(cells) != 5 or cells[0] != str(n_served) or not all(c.endswith(" ms") for c in cells[1:]):
        fails.append("the time-to-first-token row is not count %d then mean, p50, p90, p99 in ms: %r"
                     % (n_served, cells))
    bad = [n for n in nodes if n.tag == "tr" and "bad" in n.classes()]
    if not any("client_errors_total" in n.text_all() for n in bad):
        fails.append("client_errors_total (%d) is not highlighted" % st["http"]["client_errors_total"])
    if any("server_errors_total" in n.text_all() for n in bad) and not st["http"]["server_errors_total"]:
        fails.append("server_errors_total is highlighted at 0")

    w, h, rows = png_rgb(png_path)
    bar_rows = [y for y in range(h) if rows[y].count(BAR) >= 8]
    if not bar_rows:
        fails.append("no bar drawn in the %dx%d screenshot" % (w, h))
    else:
        top = bar_rows[0]  # the first bar on the page is the occupancy's
        band = [y for y in bar_rows if y - top < 14]
        y = band[len(band) // 2]
        x0 = rows[y].index(BAR)
        xs_bar = [x0]
        while xs_bar[-1] + 1 < w and rows[y][xs_bar[-1] + 1] == BAR:  # the bar's grey, one run
            xs_bar.append(xs_bar[-1] + 1)
        xs_fill = [x for x in range(xs_bar[0] - BAR_PX, xs_bar[0] + 1) if x >= 0 and rows[y][x] == FILL]
        left = xs_fill[0] if xs_fill else xs_bar[0]
        drawn = len(xs_fill)
        if not xs_fill:
            fails.append("the occupancy bar is drawn empty (row %d: no fill pixels left of its grey)" % y)
        elif xs_fill != list(range(left, left + drawn)) or left + drawn < xs_bar[0] - 1:
            fails.append("the fill is not one run ending where the bar's grey starts (row %d)" % y)
        elif abs(xs_bar[-1] + 1 - left - BAR_PX) > 1:
            fails.append("the bar spans %d px, not %d" % (xs_bar[-1] + 1 - left, BAR_PX))
        elif abs(drawn - occ * BAR_PX) > 1.5:
            fails.append("the fill is %d px of %d, the occupancy %.2f%% says %.1f px" % (drawn, BAR_PX, occ * 100,
                                                                                      occ * BAR_PX))
        stray = [yy for yy in range(h) if FILL in rows[yy] and not any(abs(yy - b) <= 1 for b in bar_rows)]
        if stray:
            fails.append("fill pixels outside every bar, on rows %d..%d" % (stray[0], stray[-1]))
        print("screenshot: occupancy bar at y=%d, x=%d..%d, fill %d px for %.2f%%"
              % (top, left, xs_bar[-1], drawn, occ * 100))
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
