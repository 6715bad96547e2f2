"""Text form of a Tensor: ``repr(t)`` and ``str(t)`` as PyTorch 2.13 prints them; print options.

The layout rules are those of ``torch/_tensor_str.py`` (``_Formatter``, ``_vector_str``,
``_tensor_str_with_formatter``, ``_add_suffixes`` and the suffix rules of ``_str_intern``), applied
to the Python values that ``tolist()`` returns, with dtypes named ``tensorbridge.<name>``. PyTorch
computes its column widths from the same Python numbers (``Tensor.__format__`` formats ``item()``),
so the text is the same, quirks included:

- An integral floating tensor prints in the ``1.`` form; nonzero finite magnitudes spanning more
  than 1000x, above 1e8 or below 1e-4 switch to scientific notation; zeros and non-finite values
  take no part in either choice.
- ``float8_e8m0fnu`` has no zero and no infinity: PyTorch's ``ne(0)`` test casts its ``0`` to the
  smallest value, 2**-127, and its ``isfinite`` is true for nan. So 2**-127 takes no part in the
  choice, and a nan does (it turns both scientific notation and the ``1.`` form off).
- ``float4_e2m1fn_x2`` (two FP4 values packed in a byte) has no conversion to a number in PyTorch,
  which prints the byte values (``tensor([ 1., 255.], dtype=torch.float4_e2m1fn_x2)``); so does
  tensorbridge.
- The ``dtype=`` suffix wraps to its own line when the line would pass ``linewidth``, counting the
  characters of ``tensorbridge.``: so a line stays within the width, as in PyTorch, and the text
  differs from PyTorch's with ``torch.`` merely replaced where PyTorch's line ends 7 characters
  short of the width.

Only printed elements are read: past ``threshold`` elements, each dimension contributes its first
and last ``edgeitems`` rows, read through views of them. Where PyTorch has no answer:

- Memory that is not host-accessible (a CUDA tensor) is never read. Such a tensor prints like
  PyTorch's meta tensors, contents elided and the shape given:
  ``tensor(..., device='cuda:0', size=(2, 3))``, with ``dtype=`` for every dtype but float32 and
  ``requires_grad=True`` when set. An empty one has nothing to read and prints as PyTorch prints
  it: ``tensor([], device='cuda:0', size=(0, 3))``.
- A 0-d ``float4_e2m1fn_x2`` tensor prints its byte,
  ``tensor(53., dtype=tensorbridge.float4_e2m1fn_x2)``, where PyTorch raises NotImplementedError.

`set_printoptions` is PyTorch's, except that it checks its arguments when called rather than
letting the next ``repr`` fail (PyTorch ignores an unknown ``profile`` and accepts a negative
``precision``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from . import _dtype

if TYPE_CHECKING:
    from ._device import Device
    from ._dtype import DType

__all__ = ["format_tensor", "get_printoptions", "printoptions", "set_printoptions"]

# PyTorch's default dtype, and the dtypes whose non-empty tensors print without ``dtype=``
# (``has_default_dtype`` in _str_intern: the default float, its complex counterpart, int64, bool).
_DEFAULT_DTYPE: Final = _dtype.float32
_IMPLICIT_DTYPES: Final = frozenset({_dtype.float32, _dtype.complex64, _dtype.int64, _dtype.bool})

# float8_e8m0fnu's smallest value, which PyTorch's ``value.ne(0)`` compares with (0 casts to it).
_E8M0_ZERO: Final = 2.0**-127

# ------------------------------------------------------------------------------------------------
# Print options


@dataclasses.dataclass
class _PrintOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


_OPTS: Final = _PrintOptions()

_PROFILES: Final[dict[str, dict[str, Any]]] = {
    "default": {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80},
    "short": {"precision": 2, "threshold": 1000, "edgeitems": 2, "linewidth": 80},
    "full": {"precision": 4, "threshold": math.inf, "edgeitems": 3, "linewidth": 80},
}


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"set_printoptions(): {name} must be an int; got {value!r}. Pass an int such as 4."
        raise TypeError(msg)
    if value < minimum:
        msg = f"set_printoptions(): {name} must be at least {minimum}; got {value!r}."
        raise ValueError(msg)


def _check_options(profile: object, counts: dict[str, object], sci_mode: object) -> None:
    """Reject a value that would make every later ``repr`` fail, before any option changes."""
    if profile is not None and profile not in _PROFILES:
        msg = (
            f"set_printoptions(): unknown profile; got {profile!r}. "
            f"Pass one of {', '.join(map(repr, _PROFILES))}."
        )
        raise ValueError(msg)
    threshold = counts.pop("threshold")
    for name, value in counts.items():
        if value is not None:
            _check_count(name, value, minimum=1 if name == "linewidth" else 0)
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float))
    ):
        msg = (
            f"set_printoptions(): threshold must be a number; got {threshold!r}. "
            "Pass an int, or math.inf to never summarise."
        )
        raise TypeError(msg)
    if sci_mode is not None and not isinstance(sci_mode, bool):
        msg = f"set_printoptions(): sci_mode must be True, False or None; got {sci_mode!r}."
        raise TypeError(msg)


def set_printoptions(
    precision: int | None = None,
    threshold: float | None = None,
    edgeitems: int | None = None,
    linewidth: int | None = None,
    profile: str | None = None,
    sci_mode: bool | None = None,
) -> None:
    """Set the options for printing tensors; PyTorch's ``torch.set_printoptions``.

    A ``profile`` is applied first and the other arguments override it. Arguments left as None
    keep their current value, except ``sci_mode``, which is always set (None restores the
    automatic choice), as in PyTorch.

    Args:
        precision: digits after the decimal point for floating values (default 4).
        threshold: number of elements above which a tensor is summarised (default 1000).
        edgeitems: rows shown at each end of each dimension when summarised (default 3).
        linewidth: characters per line before wrapping (default 80).
        profile: ``"default"``, ``"short"`` (precision 2, edgeitems 2) or ``"full"`` (never
            summarise).
        sci_mode: True or False forces scientific notation on or off; None chooses per tensor.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an unknown profile, or a negative count.

    Example:
        >>> import tensorbridge as tb
        >>> tb.set_printoptions(precision=2)
        >>> tb.tensor([1.12345])
        tensor([1.12])
        >>> tb.set_printoptions(profile="default")
    """
    given = {
        "precision": precision,
        "threshold": threshold,
        "edgeitems": edgeitems,
        "linewidth": linewidth,
    }
    _check_options(profile, dict(given), sci_mode)
    changes = {**(_PROFILES[profile] if profile is not None else {})}
    changes.update((name, value) for name, value in given.items() if value is not None)
    changes["sci_mode"] = sci_mode
    for name, value in changes.items():
        setattr(_OPTS, name, value)


def get_printoptions() -> dict[str, Any]:
    """The current print options, as a dict that ``set_printoptions(**options)`` accepts."""
    return dataclasses.asdict(_OPTS)


@contextlib.contextmanager
def printoptions(
    *,
    precision: int | None = None,
    threshold: float | None = None,
    edgeitems: int | None = None,
    linewidth: int | None = None,
    profile: str | None = None,
    sci_mode: bool | None = None,
) -> Iterator[None]:
    """Context manager: `set_printoptions` on entry, every option restored on exit.

    Args:
        precision: digits after the decimal point, as in `set_printoptions`.
        threshold: elements above which a tensor is summarised, as in `set_printoptions`.
        edgeitems: rows shown at each end when summarised, as in `set_printoptions`.
        linewidth: characters per line, as in `set_printoptions`.
        profile: ``"default"``, ``"short"`` or ``"full"``, as in `set_printoptions`.
        sci_mode: scientific notation on, off, or chosen per tensor, as in `set_printoptions`.

    Example:
        >>> import tensorbridge as tb
        >>> with tb.printoptions(precision=2):
        ...     print(tb.tensor([1.12345]))
        tensor([1.12])
    """
    saved = get_printoptions()
    set_printoptions(
        precision=precision,
        threshold=threshold,
        edgeitems=edgeitems,
        linewidth=linewidth,
        profile=profile,
        sci_mode=sci_mode,
    )
    try:
        yield
    finally:
        set_printoptions(**saved)


# ------------------------------------------------------------------------------------------------
# Reading the printed elements

_T = TypeVar("_T", bound="_Printable")


class _Printable(Protocol):
    """What printing needs from a tensor."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> DType: ...
    @property
    def device(self) -> Device: ...
    @property
    def requires_grad(self) -> bool: ...
    def numel(self) -> int: ...
    def dim(self) -> int: ...
    def tolist(self) -> Any: ...
    def view(self: _T, dtype: DType) -> _T: ...
    def __getitem__(self: _T, index: int | slice) -> _T: ...


class _Elided:
    """The ``...`` standing for the rows a summarised tensor leaves out."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "..."


_ELIDED: Final = _Elided()


def _values(t: _Printable) -> Any:
    """``t.tolist()``; a packed float4 tensor gives its byte values, as PyTorch prints them."""
    if t.dtype is _dtype.float4_e2m1fn_x2:
        return t.view(_dtype.uint8).tolist()
    return t.tolist()


def _edge_values(t: _Printable, edgeitems: int) -> Any:
    """The elements a summarised tensor (dim >= 1) prints: nested lists, `_ELIDED` for cut rows.

    Only the printed rows are read (``get_summarized_data`` picks the same elements). With
    ``edgeitems == 0`` nothing is printed and the whole tensor is `_ELIDED`.
    """
    if edgeitems == 0:
        return _ELIDED
    size = t.shape[0]
    if t.dim() == 1:
        if size > 2 * edgeitems:
            return [*_values(t[:edgeitems]), _ELIDED, *_values(t[-edgeitems:])]
        return _values(t)
    rows: Sequence[int | None] = range(size)
    if size > 2 * edgeitems:
        rows = [*range(edgeitems), None, *range(size - edgeitems, size)]
    return [_ELIDED if i is None else _edge_values(t[i], edgeitems) for i in rows]


def _leaves(data: Any, dim: int) -> Iterator[Any]:
    if dim == 0:
        yield data
    elif data is not _ELIDED:
        for row in data:
            if row is not _ELIDED:
                yield from _leaves(row, dim - 1)


# ------------------------------------------------------------------------------------------------
# Formatting


def _nonzero_finite(value: float) -> bool:
    return value != 0 and math.isfinite(value)


def _e8m0_nonzero_finite(value: float) -> bool:
    # PyTorch's isfinite is true for every float8_e8m0fnu value, nan included, and ne(0) compares
    # with 2**-127 (see the module docstring).
    return value != _E8M0_ZERO


def _is_integral(value: float) -> bool:
    """PyTorch's ``value == ceil(value)``: true for integers and infinities, false for nan."""
    return math.isinf(value) or float(value).is_integer()


def _auto_sci_mode(values: Sequence[float]) -> bool:
    """PyTorch's choice of scientific notation for nonzero finite values.

    PyTorch's min() and max() propagate nan, and every comparison with nan is false.
    """
    magnitudes = [abs(v) for v in values]
    if any(math.isnan(m) for m in magnitudes):
        return False
    low, high = min(magnitudes), max(magnitudes)
    return high / low > 1000.0 or high > 1.0e8 or low < 1.0e-4


class _Formatter:
    """``torch._tensor_str._Formatter``: one column width and notation for a set of values.

    Attributes:
        floating: real floating values (formatted with a precision) rather than ints or bools.
        int_mode: every nonzero finite value is integral: print ``1.``.
        sci_mode: print ``1.0000e+00``.
        width: the column width every value is right-aligned to.
    """

    __slots__ = ("floating", "int_mode", "sci_mode", "width")

    def __init__(
        self,
        values: Sequence[Any],
        floating: bool,
        counts: Callable[[float], bool] = _nonzero_finite,
    ) -> None:
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        if not floating:
            self.width = max([1] + [len(f"{v}") for v in values])
            return
        # Zeros and non-finite values print alike in every mode: they take no part in choosing it.
        measured = [v for v in values if counts(v)]
        self.width = 1
        if not measured:
            return
        self.int_mode = all(_is_integral(v) for v in measured)
        self.sci_mode = _auto_sci_mode(measured) if _OPTS.sci_mode is None else _OPTS.sci_mode
        self.width = max([1] + [len(self._text(v)) for v in measured])

    def _text(self, value: Any) -> str:
        if not self.floating:
            return f"{value}"
        if self.sci_mode:
            return f"{value:.{_OPTS.precision}e}"
        if self.int_mode:
            # The trailing "." marks an integral value as floating; nan and inf need no mark.
            return f"{value:.0f}." if math.isfinite(value) else f"{value:.0f}"
        return f"{value:.{_OPTS.precision}f}"

    def format(self, value: Any) -> str:
        """The value's text, right-aligned to the column width."""
        return self._text(value).rjust(self.width)


class _Formatters:
    """The formatter of a real tensor, or those of a complex tensor's real and imaginary parts."""

    __slots__ = ("imag", "real")

    def __init__(self, real: _Formatter, imag: _Formatter | None = None) -> None:
        self.real = real
        self.imag = imag

    @property
    def element_width(self) -> int:
        """Characters per element, counting the ``", "`` separator and a complex value's ``j``."""
        width = self.real.width + 2
        return width if self.imag is None else width + self.imag.width + 1

    def format(self, value: Any) -> str:
        if self.imag is None:
            return self.real.format(value)
        real = self.real.format(value.real)
        imag = (self.imag.format(value.imag) + "j").lstrip()
        # The imaginary part carries its sign (also -0.0 and -inf); a positive one gets a "+".
        return real + imag if imag[0] in "+-" else real + "+" + imag


def _formatters(data: Any, dtype: DType, dim: int) -> _Formatters:
    values = list(_leaves(data, dim))
    if dtype.kind == "c":
        return _Formatters(
            _Formatter([v.real for v in values], floating=True),
            _Formatter([v.imag for v in values], floating=True),
        )
    counts = _e8m0_nonzero_finite if dtype is _dtype.float8_e8m0fnu else _nonzero_finite
    return _Formatters(_Formatter(values, floating=dtype.kind == "f", counts=counts))


def _vector_str(values: Sequence[Any], indent: int, formatters: _Formatters) -> str:
    per_line = max(1, math.floor((_OPTS.linewidth - indent) / formatters.element_width))
    items = [" ..." if v is _ELIDED else formatters.format(v) for v in values]
    lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(data: Any, dim: int, indent: int, formatters: _Formatters) -> str:
    """``_tensor_str_with_formatter``: brackets ``dim`` deep, one more column of indent a level."""
    if dim == 0:
        return formatters.format(data)
    if data is _ELIDED:
        return "[...]"
    if dim == 1:
        return _vector_str(data, indent, formatters)
    rows = [
        "..." if row is _ELIDED else _nested_str(row, dim - 1, indent + 1, formatters)
        for row in data
    ]
    # Blank lines between blocks: one fewer than the number of dimensions below.
    return "[" + ("," + "\n" * (dim - 1) + " " * (indent + 1)).join(rows) + "]"


def _contents_str(t: _Printable, indent: int) -> str:
    """The bracketed values of a non-empty host-accessible tensor (``_tensor_str``)."""
    dim = t.dim()
    summarize = t.numel() > _OPTS.threshold
    data = _edge_values(t, _OPTS.edgeitems) if summarize and dim > 0 else _values(t)
    return _nested_str(data, dim, indent, _formatters(data, t.dtype, dim))


def _add_suffixes(text: str, suffixes: Sequence[str], indent: int) -> str:
    """Append the ``, suffix`` items (wrapped past the line width) and the closing ``)``."""
    parts = [text]
    # PyTorch's arithmetic, kept as is: it counts two characters more than a single line has.
    line_length = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if line_length + len(suffix) + 2 > _OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            line_length = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            line_length += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def format_tensor(t: _Printable) -> str:
    """The text of ``repr(t)`` and ``str(t)``: PyTorch's, with dtypes named ``tensorbridge.*``.

    Reads only the elements it prints, and never reads memory that is not host-accessible.

    Example:
        >>> import tensorbridge as tb
        >>> tb.tensor([[1, 2], [3, 4]], dtype=tb.int32)
        tensor([[1, 2],
                [3, 4]], dtype=tensorbridge.int32)
    """
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if t.device.type != "cpu":
        suffixes.append(f"device='{t.device}'")
    size, dtype = f"size={tuple(t.shape)}", f"dtype={t.dtype!r}"
    if t.numel() == 0:
        # An empty tensor shows its shape unless it is (0,), and every dtype but the default:
        # there are no values to tell an int64 tensor from a float32 one.
        body = "[]"
        suffixes += [size] if t.dim() != 1 else []
        suffixes += [dtype] if t.dtype is not _DEFAULT_DTYPE else []
    elif not t.device.is_host_accessible:
        body = "..."
        suffixes += [size, dtype] if t.dtype is not _DEFAULT_DTYPE else [size]
    else:
        body = _contents_str(t, indent)
        suffixes += [size] if not _OPTS.edgeitems else []
        suffixes += [dtype] if t.dtype not in _IMPLICIT_DTYPES else []
    if t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + body, suffixes, indent)
