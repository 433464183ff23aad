#!/bin/sh
# Writes a C file that includes one public header alone, twice (include guard).
printf '#include "%s"\n#include "%s"\n' "$1" "$1" > "$2"
