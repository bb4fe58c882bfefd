"""A picture of a proteus_compare results file: per program, the speed-up over its plain build
(the program's own kernel figure, warm medians) of ours, upstream Proteus, the nvcc build and
ours on the nvcc build, where the file has them, as a PNG.

    python -m bench.plot_speedups bench/results/proteus-compare-nvcc.json bench/results/speedups.png [--commit C]

Standard library only (zlib for the PNG, a 5x7 bitmap font for the labels), like the scripts
that run on the GPU host: a results file can be drawn wherever it is.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from pathlib import Path

from bench.proteus_compare import PROGRAMS, speedup

# (results key, label, colour): the series, in the order each program's bars are drawn
SERIES = (("ours_warm", "ours (bitcode build)", (31, 119, 180)),
          ("proteus_warm", "upstream proteus", (255, 127, 14)),
          ("nvcc", "nvcc aot build", (120, 120, 120)),
          ("ours_nvcc_warm", "ours on the nvcc build", (44, 160, 44)))

# 5x7 glyphs, a row a string: what the labels use (lower case, digits, a few signs)
_FONT_ROWS = {
    "a": ".....|.....|.###.|....#|.####|#...#|.####", "b": "#....|#....|####.|#...#|#...#|#...#|####.",
    "c": ".....|.....|.###.|#....|#....|#...#|.###.", "d": "....#|....#|.####|#...#|#...#|#...#|.####",
    "e": ".....|.....|.###.|#...#|#####|#....|.###.", "f": "..##.|.#..#|.#...|###..|.#...|.#...|.#...",
    "g": ".....|.....|.####|#...#|.####|....#|.###.", "h": "#....|#....|#.##.|##..#|#...#|#...#|#...#",
    "i": "..#..|.....|.##..|..#..|..#..|..#..|.###.", "j": "...#.|.....|..##.|...#.|...#.|#..#.|.##..",
    "k": "#....|#....|#..#.|#.#..|##...|#.#..|#..#.", "l": ".##..|..#..|..#..|..#..|..#..|..#..|.###.",
    "m": ".....|.....|##.#.|#.#.#|#.#.#|#...#|#...#", "n": ".....|.....|#.##.|##..#|#...#|#...#|#...#",
    "o": ".....|.....|.###.|#...#|#...#|#...#|.###.", "p": ".....|.....|####.|#...#|####.|#....|#....",
    "q": ".....|.....|.####|#...#|.####|....#|....#", "r": ".....|.....|#.##.|##..#|#....|#....|#....",
    "s": ".....|.....|.###.|#....|.###.|....#|####.", "t": ".#...|.#...|###..|.#...|.#...|.#..#|..##.",
    "u": ".....|.....|#...#|#...#|#...#|#..##|.##.#", "v": ".....|.....|#...#|#...#|#...#|.#.#.|..#..",
    "w": ".....|.....|#...#|#...#|#.#.#|#.#.#|.#.#.", "x": ".....|.....|#...#|.#.#.|..#..|.#.#.|#...#",
    "y": ".....|.....|#...#|#...#|.####|....#|.###.", "z": ".....|.....|#####|...#.|..#..|.#...|#####",
    "0": ".###.|#...#|#..##|#.#.#|##..#|#...#|.###.", "1": "..#..|.##..|..#..|..#..|..#..|..#..|.###.",
    "2": ".###.|#...#|....#|...#.|..#..|.#...|#####", "3": "#####|...#.|..#..|...#.|....#|#...#|.###.",
    "4": "...#.|..##.|.#.#.|#..#.|#####|...#.|...#.", "5": "#####|#....|####.|....#|....#|#...#|.###.",
    "6": "..##.|.#...|#....|####.|#...#|#...#|.###.", "7": "#####|....#|...#.|..#..|.#...|.#...|.#...",
    "8": ".###.|#...#|#...#|.###.|#...#|#...#|.###.", "9": ".###.|#...#|#...#|.####|....#|...#.|.##..",
    ".": ".....|.....|.....|.....|.....|.##..|.##..", ",": ".....|.....|.....|.....|.##..|..#..|.#...",
    "-": ".....|.....|.....|#####|.....|.....|.....", ":": ".....|.##..|.##..|.....|.##..|.##..|.....",
    "(": "...#.|..#..|.#...|.#...|.#...|..#..|...#.", ")": ".#...|..#..|...#.|...#.|...#.|..#..|.#...",
    "/": ".....|....#|...#.|..#..|.#...|#....|.....", "_": ".....|.....|.....|.....|.....|.....|#####",
    "=": ".....|.....|#####|.....|#####|.....|.....", ";": ".....|.##..|.##..|.....|.##..|..#..|.#...",
    "%": "##...|##..#|...#.|..#..|.#...|#..##|...##",
    " ": ".....|.....|.....|.....|.....|.....|.....",
}
FONT = {ch: [row for row in rows.split("|")] for ch, rows in _FONT_ROWS.items()}


class Canvas:
    """An RGB image, white to start with, written out as a PNG."""

    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(self.h, y1)):
            row = y * self.w * 3
            for x in range(max(0, x0), min(self.w, x1)):
                self.px[row + 3 * x: row + 3 * x + 3] = bytes(rgb)

    def text(self, x: int, y: int, s: str, rgb=(0, 0, 0), scale: int = 2) -> int:
        """Draw `s` with its top left at (x, y); the x just past it. A character the font lacks is a blank."""
        for ch in s.lower():
            for r, row in enumerate(FONT.get(ch, FONT[" "])):
                for c, bit in enumerate(row):
                    if bit == "#":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, rgb)
            x += 6 * scale
        return x

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def speedups(doc: dict) -> list[tuple[str, str, dict[str, float | None]]]:
    """Per program in the file: (name, its figure, {series key: speed-up over plain, or None
    where that series' output differed from its reference: no speed to show})."""
    out = []
    for prog, res in doc.get("programs", {}).items():
        if prog not in PROGRAMS:
            continue
        name, _, better = PROGRAMS[prog][1][0]
        med = {k: ((res.get(k) or {}).get("metrics") or {}).get(name, {}).get("median") for k in ("plain", *(s[0] for s in SERIES))}
        if not med["plain"]:
            continue
        out.append((prog, name, {k: speedup(better, v, med["plain"]) if res[k].get("all_ok", True) else None
                                 for k, v in med.items() if k != "plain" and v}))
    return out


def draw(doc: dict, commit: str = "") -> bytes:
    rows = speedups(doc)
    if not rows:
        raise ValueError("no program with a plain build's figure and another's")
    present = [s for s in SERIES if any(s[0] in r[2] for r in rows)]
    top = max([1.0] + [v for r in rows for v in r[2].values() if v is not None])
    xmax = max(2.0, int(top * 2 + 1) / 2)  # the axis, in steps of 0.5
    left, right, bar, gap = 300, 60, 16, 28
    group = bar * len(present) + gap
    legend_h = 24 * len(present) + 10
    width, height = 1100, 90 + group * len(rows) + 50 + legend_h
    c = Canvas(width, height)
    stamp = doc.get("stamp") or {}
    c.text(20, 14, "speed-up over the plain build, warm medians (higher is faster)")
    c.text(20, 40, f"{stamp.get('gpu', '?').split(',')[0]}, commit {(commit or str(stamp.get('commit', '?')))[:12]}; "
                   "no bar where the output differed", (90, 90, 90))
    plot_w = width - left - right

    def x_of(v: float) -> int:
        return left + int(plot_w * min(v, xmax) / xmax)
    y0 = 80
    for i in range(int(xmax * 2) + 1):  # grid every 0.5, labelled every 1.0 and at 1.5
        v = i / 2
        c.rect(x_of(v), y0, x_of(v) + 1, y0 + group * len(rows), (225, 225, 225))
        c.text(x_of(v) - 12, y0 + group * len(rows) + 8, f"{v:.1f}", (90, 90, 90))
    c.rect(x_of(1.0), y0 - 4, x_of(1.0) + 2, y0 + group * len(rows) + 4, (0, 0, 0))  # the plain build
    for g, (prog, figure, ups) in enumerate(rows):
        y = y0 + g * group
        c.text(20, y + 4, prog)
        c.text(20, y + 24, figure, (110, 110, 110))
        for j, (key, _label, rgb) in enumerate(present):
            by = y + j * bar
            if ups.get(key) is not None:
                c.rect(left, by, x_of(ups[key]), by + bar - 3, rgb)
                c.text(x_of(ups[key]) + 6, by + 1, f"{ups[key]:.2f}x", (60, 60, 60))
            elif key in ups:
                c.rect(left, by, left + 8, by + bar - 3, rgb)
                c.text(left + 14, by + 1, "output differs", (150, 150, 150))
    ly = y0 + group * len(rows) + 40
    for j, (_key, label, rgb) in enumerate(present):
        c.rect(left, ly + 24 * j, left + 30, ly + 24 * j + 14, rgb)
        c.text(left + 40, ly + 24 * j, label)
    return c.png()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a proteus_compare JSON results file")
    ap.add_argument("png", help="the picture to write")
    ap.add_argument("--commit", default="", help="the tree the results came from, where the file's stamp is wrong "
                                                 "(results written before the stamp came from .gpu/commit)")
    args = ap.parse_args(argv)
    try:
        doc = json.loads(Path(args.results).read_text())
        data = draw(doc, args.commit)
    except (OSError, ValueError) as exc:
        print(f"plot_speedups: {args.results}: {exc}", file=sys.stderr)
        return 2
    Path(args.png).write_bytes(data)
    print(f"plot_speedups: wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
