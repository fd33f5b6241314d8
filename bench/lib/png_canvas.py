"""A tiny RGB canvas that writes PNG with zlib: lines, rectangles and 5x7 bitmap text.

Enough for benchmark line plots without a plotting dependency.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

Color = tuple[int, int, int]

# 5x7 glyphs, one hex byte per row (top to bottom), bit 4 the leftmost column. Text is drawn lowercased.
_GLYPHS = {
    "0": "0e11131519110e",
    "1": "040c040404040e",
    "2": "0e11010204081f",
    "3": "1f02040201110e",
    "4": "02060a121f0202",
    "5": "1f101e0101110e",
    "6": "0608101e11110e",
    "7": "1f010204080808",
    "8": "0e11110e11110e",
    "9": "0e11110f01020c",
    "a": "00000e010f110f",
    "b": "1010161911111e",
    "c": "00000e1010110e",
    "d": "01010d1311110f",
    "e": "00000e111f100e",
    "f": "0609081c080808",
    "g": "000f11110f010e",
    "h": "10101619111111",
    "i": "04000c0404040e",
    "j": "0200060202120c",
    "k": "10101214181412",
    "l": "0c04040404040e",
    "m": "00001a15151111",
    "n": "00001619111111",
    "o": "00000e1111110e",
    "p": "00001e111e1010",
    "q": "00000d130f0101",
    "r": "00001619101010",
    "s": "00000e100e011e",
    "t": "08081c08080906",
    "u": "0000111111130d",
    "v": "00001111110a04",
    "w": "0000111115150a",
    "x": "0000110a040a11",
    "y": "000011110f010e",
    "z": "00001f0204081f",
    " ": "00000000000000",
    ".": "00000000000c0c",
    ",": "000000000c0408",
    "-": "0000001f000000",
    "_": "0000000000001f",
    "/": "00010204081000",
    "(": "02040808080402",
    ")": "08040202020408",
    ":": "000c0c000c0c00",
    "=": "00001f001f0000",
    "%": "18190204081303",
    "+": "0004041f040400",
}
GLYPH_ROWS = {char: [int(code[i : i + 2], 16) for i in range(0, 14, 2)] for char, code in _GLYPHS.items()}
TEXT_SCALE = 2
CHAR_WIDTH = 6 * TEXT_SCALE
TEXT_HEIGHT = 7 * TEXT_SCALE


class Canvas:
    """``width`` x ``height`` pixels, white; (0, 0) is the top left."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: Color, size: int = 1) -> None:
        for dy in range(size):
            for dx in range(size):
                px, py = x + dx - size // 2, y + dy - size // 2
                if 0 <= px < self.width and 0 <= py < self.height:
                    offset = (py * self.width + px) * 3
                    self.pixels[offset : offset + 3] = bytes(color)

    def line(self, start: tuple[float, float], end: tuple[float, float], color: Color, width: int = 1, dash: int = 0) -> None:
        """A straight line; ``dash`` > 0 draws ``dash`` pixels on, ``dash`` off."""
        (x0, y0), (x1, y1) = start, end
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(steps):
            if dash and (i // dash) % 2:
                continue
            t = i / max(steps - 1, 1)
            self.dot(round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t), color, width)

    def rect(self, left: int, top: int, right: int, bottom: int, color: Color) -> None:
        for start, end in (((left, top), (right, top)), ((right, top), (right, bottom)), ((right, bottom), (left, bottom)), ((left, bottom), (left, top))):
            self.line(start, end, color)

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), anchor: str = "left") -> None:
        """``text`` with its top at ``y``; ``anchor`` left, center or right of ``x``."""
        width = len(text) * CHAR_WIDTH
        x -= {"left": 0, "center": width // 2, "right": width}[anchor]
        for index, char in enumerate(text.lower()):
            rows = GLYPH_ROWS.get(char, GLYPH_ROWS[" "])
            for row, bits in enumerate(rows):
                for column in range(5):
                    if bits & (0x10 >> column):
                        left, top = x + index * CHAR_WIDTH + column * TEXT_SCALE, y + row * TEXT_SCALE
                        self.dot(left + TEXT_SCALE // 2, top + TEXT_SCALE // 2, color, TEXT_SCALE)

    def save(self, path: Path) -> None:
        stride = self.width * 3
        raw = b"".join(b"\x00" + self.pixels[y * stride : (y + 1) * stride] for y in range(self.height))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
