"""`bench.serve_load`'s plot: output tokens/s and ITL p99 against concurrency, one line per mode.

Concurrency is on a log2 axis, ITL p99 on a log10 axis; the default model's lines are dashed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from bench.lib.png_canvas import TEXT_HEIGHT, Canvas, Color

PALETTE: list[Color] = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75), (227, 119, 194), (23, 190, 207)]
GRID: Color = (225, 225, 225)
WIDTH, HEIGHT = 1280, 640
MARGIN_LEFT, MARGIN_TOP, PANEL_GAP, LEGEND_HEIGHT = 90, 70, 110, 120


def _nice_step(span: float) -> float:
    raw = span / 5
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _label(value: float) -> str:
    return f"{value:g}" if value < 10_000 else f"{value / 1000:g}k"


class Panel:
    """One plot area: log2 x (concurrency) and a linear or log10 y."""

    def __init__(self, canvas: Canvas, box: tuple[int, int, int, int], x_range: tuple[int, int], y_range: tuple[float, float], log_y: bool) -> None:
        self.canvas, self.box, self.log_y = canvas, box, log_y
        self.x_range = (math.log2(x_range[0]), math.log2(x_range[1]))
        self.y_range = (math.log10(y_range[0]), math.log10(y_range[1])) if log_y else y_range

    def point(self, x: float, y: float) -> tuple[float, float]:
        left, top, right, bottom = self.box
        fx = (math.log2(x) - self.x_range[0]) / max(self.x_range[1] - self.x_range[0], 1e-9)
        y_value = math.log10(max(y, 1e-9)) if self.log_y else y
        fy = (y_value - self.y_range[0]) / max(self.y_range[1] - self.y_range[0], 1e-9)
        return left + fx * (right - left), bottom - min(max(fy, 0.0), 1.0) * (bottom - top)

    def axes(self, title: str, x_ticks: list[int], y_ticks: list[float]) -> None:
        canvas, (left, top, right, bottom) = self.canvas, self.box
        for x in x_ticks:
            px, _ = self.point(x, 1)
            canvas.line((px, top), (px, bottom), GRID)
            canvas.text(int(px), bottom + 8, str(x), anchor="center")
        for y in y_ticks:
            _, py = self.point(x_ticks[0], y)
            canvas.line((left, py), (right, py), GRID)
            canvas.text(left - 8, int(py) - TEXT_HEIGHT // 2, _label(y), anchor="right")
        canvas.rect(left, top, right, bottom, (0, 0, 0))
        canvas.text((left + right) // 2, top - TEXT_HEIGHT - 10, title, anchor="center")
        canvas.text((left + right) // 2, bottom + 16 + TEXT_HEIGHT, "concurrent streams", anchor="center")

    def series(self, points: list[tuple[int, float]], color: Color, dash: int) -> None:
        pixels = [self.point(x, y) for x, y in points]
        for start, end in zip(pixels, pixels[1:]):
            self.canvas.line(start, end, color, width=3, dash=dash)
        for px, py in pixels:
            self.canvas.dot(round(px), round(py), color, 7)


def _series(rows: list[dict], field: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in sorted(rows, key=lambda r: r["concurrency"]):
        if isinstance(row[field], (int, float)) and row[field] > 0:
            lines.setdefault((row["model"], row["mode"]), []).append((row["concurrency"], row[field]))
    return lines


def _panel(canvas: Canvas, box: tuple[int, int, int, int], rows: list[dict], field: str, title: str, log_y: bool, colors: Callable[[str], Color]) -> None:
    lines = _series(rows, field)
    xs = sorted({x for points in lines.values() for x, _ in points})
    ys = [y for points in lines.values() for _, y in points]
    if log_y:
        low, high = 10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys)))
        ticks = [10**e for e in range(round(math.log10(low)), round(math.log10(high)) + 1)]
    else:
        step = _nice_step(max(ys))
        low, high = 0.0, step * math.ceil(max(ys) * 1.05 / step)
        ticks = [step * i for i in range(int(high / step) + 1)]
    panel = Panel(canvas, box, (xs[0], xs[-1]), (low, high), log_y)
    panel.axes(title, xs, ticks)
    for (model, mode), points in lines.items():
        panel.series(points, colors(mode), dash=0 if model == "tiny-random" else 6)


def plot_rows(rows: list[dict], path: Path, proxy: str) -> None:
    """Write the PNG of the raw client's ``rows`` run under ``proxy`` (other proxies' and clients' rows are left out)."""
    rows = [r for r in rows if r["proxy"] == proxy and r.get("client", "raw") == "raw"]
    if not rows:
        return
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    colors = {mode: PALETTE[i % len(PALETTE)] for i, mode in enumerate(modes)}
    canvas = Canvas(WIDTH, HEIGHT)
    panel_width = (WIDTH - MARGIN_LEFT - PANEL_GAP - 40) // 2
    bottom = HEIGHT - LEGEND_HEIGHT
    left_box = (MARGIN_LEFT, MARGIN_TOP, MARGIN_LEFT + panel_width, bottom)
    right_box = (MARGIN_LEFT + panel_width + PANEL_GAP, MARGIN_TOP, MARGIN_LEFT + 2 * panel_width + PANEL_GAP, bottom)
    _panel(canvas, left_box, rows, "output_tokens_per_s", "output tokens/s", False, colors.__getitem__)
    _panel(canvas, right_box, rows, "itl_p99_ms", "inter-token latency p99 (ms, log)", True, colors.__getitem__)
    legend_y = bottom + 60
    for i, mode in enumerate(modes):
        x = MARGIN_LEFT + (i % 4) * 280
        y = legend_y + (i // 4) * 26
        canvas.line((x, y + TEXT_HEIGHT // 2), (x + 30, y + TEXT_HEIGHT // 2), colors[mode], width=3)
        canvas.text(x + 38, y, mode)
    note = f"proxy: {proxy}. solid: tiny-random, dashed: smollm2-135m-instruct"
    canvas.text(WIDTH - 20, 12, note, anchor="right")
    canvas.text(MARGIN_LEFT, 12, "bench.serve_load", anchor="left")
    canvas.save(path)
