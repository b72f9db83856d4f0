"""Tables that fit the terminal: the first layout that fits the width is printed, and no cell is ever cut.

Each table is built in a few layouts, widest first (the full table, then a compact one with short headers,
abbreviated units and secondary columns dropped). :class:`Fit` measures them at print time against the
console's width (``COLUMNS``, else the terminal, else 80). Every column folds instead of cutting with an
ellipsis, so even the narrowest layout on a very narrow terminal keeps every character of a name or number.
"""

from __future__ import annotations

from collections.abc import Callable

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from arachne.spec.names import printable


class Fit:
    """A renderable that prints the first of ``layouts`` (builders, widest first) that fits the width."""

    def __init__(self, *layouts: Callable[[], Table]):
        self.layouts = layouts

    def choose(self, console: Console, options: ConsoleOptions) -> Table:
        unbounded = options.update_width(1_000_000)  # a table's natural width, not the width it would squeeze to
        table = self.layouts[0]()
        for build in self.layouts[1:]:
            if Measurement.get(console, unbounded, table).maximum <= options.max_width:
                return table
            table = build()
        return table

    @property
    def row_count(self) -> int:
        """Rows of the table (every layout has the same rows)."""
        return self.layouts[0]().row_count

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.choose(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.choose(console, options))


def wide_table(title: str | None = None, **kw) -> Table:
    """The full layout (rich's default box)."""
    return Table(title=title, title_justify="left", **kw)


def compact_table(title: str | None = None, **kw) -> Table:
    """The compact layout: a rule under the header, no vertical lines, two spaces between columns."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                 padding=(0, 1, 0, 0), **kw)


def column(table: Table, header: str, justify: str = "right") -> None:
    """Add a column whose cells wrap at spaces and fold a word longer than the column onto the next line, so
    that nothing is cut (rich's ``no_wrap`` would crop). The layouts are sized so that at their natural
    width nothing wraps; only a terminal narrower than the narrowest layout makes cells wrap."""
    table.add_column(header, justify=justify, overflow="fold")  # type: ignore[arg-type]


def text(value: object, style: str = "") -> Text:
    """A cell from a user's file or an error message: plain text (never markup), control characters escaped."""
    return Text(printable(value), style=style)


def caption(table: Table, lines: list[str]) -> Table:
    """Set ``table``'s caption to ``lines`` (each shown as :func:`text`, one per line), left-aligned."""
    if lines:
        table.caption = Text("\n").join(text(line) for line in lines)
        table.caption_justify = "left"
    return table
