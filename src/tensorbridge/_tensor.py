"""`Tensor`: a strided view of memory that someone else may own.

A tensor is ``(storage, offset, shape, strides, dtype)`` with the offset and strides in elements. Its
metadata never changes after construction (``requires_grad`` aside); every view shares the storage and
never copies. Element access goes through the dtype's codec (`_codec`) and the one strided copy routine
(`_memory.copy_region`); both run only on host-accessible memory, after a bounds check.
"""

from __future__ import annotations

import builtins
import itertools
import math
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import (
    _arrow_export,
    _buffer_export,
    _codec,
    _dlpack_export,
    _dtype,
    _format,
    _interface_export,
    _layout,
    _memory,
    _native,
    _peers,
    _pickle,
    _shared,
)
from ._args import GRAD_MSG, GRAD_MSG_METHOD
from ._device import CPU, Device, as_device
from ._dtype import DType, as_dtype, foreign_dtype
from ._errors import warn_user
from ._fields import TensorFields
from ._indexing import INDEX_DTYPES, UINT8_INDEX_WARNING, Advanced, parse_index
from ._indexing import check_bounds as check_index_bounds
from ._layout import Size
from ._storage import Storage, allocate, check_view

__all__ = ["Tensor"]

# `cls.__new__(cls)` and `Size(shape)` for a tuple ``shape``, bound once (`_construct` runs on every
# import and view), from the native layer: compiled, a direct call of the class's C allocator with
# no argument tuple to build or parse, and a `Size` allocated and filled in place.
_new_object = _native.new_object
_new_size = _native.tuple_maker(Size)


def _construct(
    cls: type[Tensor],
    storage: Storage,
    offset: int,
    shape: Sequence[int],
    strides: Sequence[int],
    dtype: DType,
    api: str = "Tensor._new",
    requires_grad: bool = False,
    checked: bool = False,
) -> Tensor:
    """The constructor: the one way any module, this one included, builds a tensor (`Tensor._new`).

    The layout must lie inside the storage (`_storage.check_view`, with Python ints: nothing
    wraps). ``checked=True`` says the caller has already bounded the layout by the storage, so the
    check is not run twice on a hot path: the storage was made by `_storage.locate` (or
    `_storage.wrap`) for exactly this layout; frombuffer's argument checks bound its one contiguous
    run; or the layout is a view this module derived from a checked one.
    """
    if type(shape) is not tuple:
        shape = tuple(shape)
    if type(strides) is not tuple:
        strides = tuple(strides)
    if not checked:
        check_view(storage, offset, shape, strides, dtype.itemsize, api)
    self: Any = _new_object(cls)
    self._storage = storage
    self._offset = offset
    self._shape = _new_size(shape)
    self._strides = strides
    self._dtype = dtype
    self._requires_grad = requires_grad
    return self


class Tensor(TensorFields):
    """A strided, typed view of a block of memory on some device.

    Create tensors with `tensorbridge.tensor`, `from_dlpack`, `frombuffer`, `asarray` and friends;
    direct construction is refused. Views (indexing, `view`, `transpose`, ...) share the memory;
    `clone`, `contiguous` on a non-contiguous tensor, and `to` with another dtype copy it.

    The memory stays valid while any view lives: each tensor holds its storage, and the storage holds
    the object that owns the memory (see `tensorbridge._storage`).
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        msg = (
            "Tensor() cannot be constructed directly; use tensorbridge.tensor(data), "
            "tensorbridge.from_dlpack(obj), tensorbridge.frombuffer(buf, dtype=...) or tensorbridge.asarray(obj)."
        )
        raise TypeError(msg)

    # The constructor (``Tensor._new(storage, offset, shape, strides, dtype, api="Tensor._new",
    # requires_grad=False, checked=False)``): `_construct`, a class method of every tensor class.
    _new = classmethod(_construct)

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> Size:
        """The size of each dimension (a `Size`, a tuple of ints)."""
        return self._shape

    def size(self, dim: int | None = None) -> Any:
        """The shape, or the size of dimension ``dim``.

        Args:
            dim: a dimension (negative counts from the end); None for the whole shape.
        """
        if dim is None:
            return self._shape
        return self._shape[_layout.normalize_dim(dim, self.ndim, "size", scalar_ok=False)]

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self._dtype

    @property
    def device(self) -> Device:
        """Where the memory lives."""
        return self._storage.device

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    def dim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    def element_size(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes the elements occupy (``numel() * element_size()``), as in PyTorch."""
        return self.numel() * self._dtype.itemsize

    def stride(self, dim: int | None = None) -> Any:
        """Strides in elements, or the stride of dimension ``dim``.

        Args:
            dim: a dimension (negative counts from the end); None for every stride.
        """
        if dim is None:
            return self._strides
        return self._strides[_layout.normalize_dim(dim, self.ndim, "stride", scalar_ok=False)]

    def storage_offset(self) -> int:
        """Offset of the first element from the start of the storage, in elements."""
        return self._offset

    def data_ptr(self) -> int:
        """Address of the first element (0 for an empty tensor whose producer gave no memory)."""
        return self._storage.ptr + self._offset * self._dtype.itemsize

    def is_contiguous(self) -> bool:
        """True when the elements are compact in row-major order."""
        return _layout.is_contiguous(self._shape, self._strides)

    @property
    def is_readonly(self) -> bool:
        """True when the memory must not be written (read-only buffer, ``READ_ONLY`` capsule, ...)."""
        return self._storage.readonly

    @property
    def is_cpu(self) -> bool:
        """True for plain CPU memory."""
        return self._storage.device.type == "cpu"

    @property
    def is_cuda(self) -> bool:
        """True for CUDA device memory."""
        return self._storage.device.type == "cuda"

    @property
    def requires_grad(self) -> bool:
        """Carried for frameworks with autograd; blocks DLPack export as in PyTorch."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._set_requires_grad(value, "requires_grad", GRAD_MSG)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` in place; only floating and complex tensors may require gradients.

        Args:
            requires_grad: the new flag (True by default, as in PyTorch).
        """
        return self._set_requires_grad(requires_grad, "requires_grad_", GRAD_MSG_METHOD)

    def _set_requires_grad(self, requires_grad: bool, api: str, torch_text: str) -> Tensor:
        # RuntimeError, as PyTorch: the tensor's dtype (its state), not the argument, is at fault.
        if requires_grad and self._dtype.kind not in "fc":
            msg = (
                f"{api}(): {torch_text}; got a tensor of dtype {self._dtype}. Floating point and complex "
                f"tensors can; convert first, e.g. to(tensorbridge.float32)."
            )
            raise RuntimeError(msg)
        self._requires_grad = builtins.bool(requires_grad)
        return self

    def detach(self) -> Tensor:
        """A view of the same memory that does not require gradients."""
        return Tensor._new(
            self._storage, self._offset, self._shape, self._strides, self._dtype, checked=True
        )

    # ------------------------------------------------------------------ views
    def _view(self, offset: int, shape: Sequence[int], strides: Sequence[int]) -> Tensor:
        """A view derived from this tensor's checked layout (the caller keeps it inside)."""
        return Tensor._new(
            self._storage,
            offset,
            shape,
            strides,
            self._dtype,
            "view",
            self._requires_grad,
            checked=True,
        )

    def view(self, *shape: Any) -> Tensor:
        """The same memory with another shape; raises when the strides make that impossible."""
        if not shape:
            msg = "view() received an invalid combination of arguments - got (); give a shape or a dtype."
            raise TypeError(msg)
        if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list)):
            dtype = shape[0] if isinstance(shape[0], DType) else foreign_dtype(shape[0], "view")
            if dtype is not None:
                return self._view_dtype(dtype)
        new_shape = _layout.infer_shape(self.numel(), _layout_args(shape, "view"), "view")
        strides = _layout.view_strides(self._shape, self._strides, new_shape)
        if strides is None:
            msg = (
                f"view(): view size is not compatible with input tensor's size and stride (at least one "
                f"dimension spans across two contiguous subspaces). Use .reshape(...) instead. Got shape "
                f"{list(new_shape)} for sizes {list(self._shape)} and strides {list(self._strides)}."
            )
            raise RuntimeError(msg)
        return self._view(self._offset, new_shape, strides)

    def _view_dtype(self, dtype: DType) -> Tensor:
        if dtype.itemsize != self._dtype.itemsize:
            msg = (
                f"view(): viewing a tensor of {self._dtype} as {dtype} needs equal element sizes "
                f"({self._dtype.itemsize} != {dtype.itemsize}); got {dtype!r}."
            )
            raise RuntimeError(msg)
        return Tensor._new(
            self._storage, self._offset, self._shape, self._strides, dtype, checked=True
        )

    def reshape(self, *shape: Any) -> Tensor:
        """A view with the new shape when possible, else a contiguous copy."""
        if not shape:
            msg = 'reshape() missing 1 required positional arguments: "shape"'
            raise TypeError(msg)
        new_shape = _layout.infer_shape(self.numel(), _layout_args(shape, "reshape"), "reshape")
        strides = _layout.view_strides(self._shape, self._strides, new_shape)
        if strides is None:
            return self.contiguous().view(new_shape)
        return self._view(self._offset, new_shape, strides)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge dims ``start_dim..end_dim`` into one (a view when possible).

        Args:
            start_dim: the first dimension merged.
            end_dim: the last dimension merged (inclusive; -1 is the last one).
        """
        # Both dims are range-checked first, for a 0-d tensor too ([-1, 0]), as in PyTorch.
        s = _layout.normalize_dim(start_dim, self.ndim, "flatten")
        e = _layout.normalize_dim(end_dim, self.ndim, "flatten")
        if self.ndim == 0:
            return self.reshape(1)
        if s > e:
            msg = "flatten() has invalid args: start_dim cannot come after end_dim"
            raise RuntimeError(msg)
        shape = (*self._shape[:s], math.prod(self._shape[s : e + 1]), *self._shape[e + 1 :])
        return self.reshape(shape)

    def permute(self, *dims: Any) -> Tensor:
        """A view with the dimensions reordered."""
        if not dims:
            msg = 'permute() missing 1 required positional arguments: "dims"'
            raise TypeError(msg)
        given = _layout_args(dims, "permute")
        if len(given) != self.ndim:
            msg = (
                f"permute(): number of dimensions in the tensor input does not match the length of the "
                f"desired ordering of dimensions i.e. input.dim() = {self.ndim} is not equal to "
                f"len(dims) = {len(given)}. Name every dimension once."
            )
            raise RuntimeError(msg)
        order = [_layout.normalize_dim(d, self.ndim, "permute") for d in given]
        if len(set(order)) != len(order):
            msg = (
                f"permute(): duplicate dims are not allowed. Got dims {list(given)}; name each dimension "
                f"once."
            )
            raise RuntimeError(msg)
        return self._view(
            self._offset, [self._shape[d] for d in order], [self._strides[d] for d in order]
        )

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """A view with two dimensions swapped."""
        if self.ndim == 0:
            _layout.normalize_dim(dim0, 0, "transpose")
            _layout.normalize_dim(dim1, 0, "transpose")
            return self._view(self._offset, (), ())
        a = _layout.normalize_dim(dim0, self.ndim, "transpose")
        b = _layout.normalize_dim(dim1, self.ndim, "transpose")
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    swapaxes = transpose

    def t(self) -> Tensor:
        """Transpose of a tensor with at most 2 dimensions."""
        if self.ndim > 2:
            msg = f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D"
            raise RuntimeError(msg)
        return (
            self.transpose(0, 1)
            if self.ndim == 2
            else self._view(self._offset, self._shape, self._strides)
        )

    @property
    def T(self) -> Tensor:
        """All dimensions reversed."""
        if self.ndim == 0:
            _warn_zero_d("T", "This function is the identity in these cases.")
            return self._view(self._offset, (), ())
        return self.permute(list(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> Tensor:
        """The last two dimensions swapped (a batch of matrix transposes)."""
        if self.ndim == 0:
            # PyTorch 2.13 returns a 0-d tensor unchanged, with a deprecation warning.
            _warn_zero_d("mT", "This function is the identity in these cases.")
            return self._view(self._offset, (), ())
        if self.ndim < 2:
            msg = f"tensor.mT is only supported on matrices or batches of matrices. Got {self.ndim}-D tensor."
            raise RuntimeError(msg)
        return self.transpose(-2, -1)

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Remove size-1 dimensions (all of them, or those named in ``dim``).

        Args:
            dim: a dimension or a sequence of them; a named dimension whose size is not 1 stays.
                None removes every size-1 dimension.
        """
        if dim is None:
            keep = [i for i, s in enumerate(self._shape) if s != 1]
        else:
            dims = (dim,) if isinstance(dim, int) else tuple(dim)
            drop: set[int] = set()
            for d in dims:  # in PyTorch's order: each dim is wrapped, then checked for repeats
                named = _layout.normalize_dim(d, self.ndim, "squeeze")
                if named in drop:
                    msg = f"squeeze(): dim {named} appears multiple times in the list of dims"
                    raise RuntimeError(msg)
                drop.add(named)
            keep = [i for i in range(self.ndim) if not (i in drop and self._shape[i] == 1)]
        return self._view(
            self._offset, [self._shape[i] for i in keep], [self._strides[i] for i in keep]
        )

    def unsqueeze(self, dim: int) -> Tensor:
        """Insert a size-1 dimension at ``dim``."""
        d = _layout.normalize_dim(dim, self.ndim + 1, "unsqueeze")
        stride = self._strides[d] * self._shape[d] if d < self.ndim else 1
        return self._view(
            self._offset,
            (*self._shape[:d], 1, *self._shape[d:]),
            (*self._strides[:d], stride, *self._strides[d:]),
        )

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        """A view of ``length`` elements of dimension ``dim`` from ``start``."""
        if self.ndim == 0:
            msg = "narrow() cannot be applied to a 0-dim tensor. Call unsqueeze(0) first."
            raise RuntimeError(msg)
        start, length = _layout_args((start, length), "narrow")
        if length < 0:
            msg = f"narrow(): length must be non-negative. Got length={length}."
            raise RuntimeError(msg)
        d = _layout.normalize_dim(dim, self.ndim, "narrow")
        size = self._shape[d]
        if not -size <= start <= size:
            msg = (
                f"narrow(): start out of range (expected to be in range of [{-size}, {size}], but got "
                f"{start})"
            )
            raise IndexError(msg)
        if start < 0:
            start += size
        if start + length > size:
            msg = (
                f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({size}). "
                f"Choose a start and length inside dimension {d}."
            )
            raise RuntimeError(msg)
        shape = list(self._shape)
        shape[d] = length
        return self._view(self._offset + start * self._strides[d], shape, self._strides)

    def expand(self, *sizes: Any) -> Tensor:
        """A broadcast view: size-1 dims repeat with stride 0, new leading dims are added."""
        if not sizes:
            msg = 'expand() missing 1 required positional arguments: "size"'
            raise TypeError(msg)
        target = _layout_args(sizes, "expand")
        strides = _layout.expand_strides(self._shape, self._strides, target, "expand")
        shape = [
            s if s != -1 else self._shape[i - (len(target) - self.ndim)]
            for i, s in enumerate(target)
        ]
        return self._view(self._offset, shape, strides)

    def expand_as(self, other: Tensor) -> Tensor:
        """`expand` to ``other``'s shape."""
        return self.expand(other.shape)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """Views of each slice along ``dim``.

        Args:
            dim: the dimension removed (each result is one index along it).
        """
        d = _layout.normalize_dim(dim, self.ndim, "unbind", scalar_ok=False)
        shape = self._shape[:d] + self._shape[d + 1 :]
        strides = self._strides[:d] + self._strides[d + 1 :]
        return tuple(
            self._view(self._offset + i * self._strides[d], shape, strides)
            for i in range(self._shape[d])
        )

    def as_strided(
        self, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
    ) -> Tensor:
        """A view with an explicit layout, checked to lie inside the storage (PyTorch does not check).

        Args:
            size: the view's shape.
            stride: its strides, in elements.
            storage_offset: the offset of its first element in the storage, in elements; None
                keeps this tensor's own.
        """
        shape = _layout.as_shape((size,), "as_strided")
        strides = tuple(_layout_args((stride,), "as_strided"))
        if len(strides) != len(shape):
            msg = (
                f"as_strided(): mismatch in length of strides and shape; got size {list(shape)} and "
                f"stride {list(strides)}."
            )
            raise RuntimeError(msg)
        offset = self._offset if storage_offset is None else storage_offset
        # NOTE: a layout outside the storage is a ValueError, as every layout tensorbridge checks
        # (from_pointer, imports), where PyTorch raises RuntimeError for the upper end only and
        # lets other layouts through; the bounds check is tensorbridge's own safety guarantee.
        check_view(self._storage, offset, shape, strides, self._dtype.itemsize, "as_strided")
        return self._view(offset, shape, strides)

    # ------------------------------------------------------------------ element access
    def _region(self, api: str) -> tuple[memoryview, int, tuple[int, ...], tuple[int, ...], int]:
        return (
            self._storage.host_view(api),
            self._offset,
            self._strides,
            self._shape,
            self._dtype.itemsize,
        )

    def _bytes(self, api: str) -> bytearray:
        """The elements packed row-major (host memory only)."""
        mv, offset, strides, shape, itemsize = self._region(api)
        try:
            return _memory.gather(mv, offset, strides, shape, itemsize)
        except MemoryError:
            # A broadcast view can describe far more elements than memory holds.
            msg = (
                f"{api}(): cannot allocate {self.nbytes} bytes to copy a tensor of shape "
                f"{list(shape)} and dtype {self._dtype}; the system is out of memory. Copy a "
                f"smaller part."
            )
            raise MemoryError(msg) from None

    def _values(self, api: str) -> list[Any]:
        """All elements as Python values, row-major."""
        return _codec.unpack(self._dtype, self._bytes(api))

    def _check_writable(self, api: str) -> None:
        if self._storage.readonly:
            msg = (
                f"{api}(): cannot write to a read-only tensor (its memory came from a read-only buffer "
                f"or a READ_ONLY DLPack capsule). Write to a clone() instead."
            )
            raise ValueError(msg)

    def tolist(self) -> Any:
        """Nested Python lists of the elements (a scalar for a 0-d tensor)."""
        values = self._values("tolist")
        return _nest(values, self._shape)

    def item(self) -> Any:
        """The single element as a Python scalar."""
        if self.numel() != 1:
            msg = (
                f"item(): a Tensor with {self.numel()} elements cannot be converted to Scalar. "
                f"Index one element first."
            )
            raise RuntimeError(msg)
        return self._values("item")[0]

    def __bool__(self) -> bool:
        if self.numel() != 1:
            amount = "more than one value" if self.numel() else "no values"
            msg = (
                f"__bool__(): Boolean value of Tensor with {amount} is ambiguous; got {self.numel()} "
                f"elements. Test one element, or compare tolist()."
            )
            raise RuntimeError(msg)
        return builtins.bool(self.item())

    def __int__(self) -> int:
        return int(self._real_scalar("__int__", "int64_t"))

    def __float__(self) -> float:
        return builtins.float(self._real_scalar("__float__", "double"))

    def _real_scalar(self, api: str, c_type: str) -> Any:
        """The one element, its imaginary part dropped only when it is 0."""
        value = self._scalar(api)
        if self._dtype.kind == "c":
            if value.imag != 0:
                # PyTorch 2.13 refuses to drop an imaginary part here (c10::checked_convert).
                msg = (
                    f"{api}(): value cannot be converted to type {c_type} without overflow; got "
                    f"{value!r}, whose imaginary part is not 0. Take .real first."
                )
                raise RuntimeError(msg)
            value = value.real
        return value

    def __complex__(self) -> complex:
        return complex(self._scalar("__complex__"))

    def __index__(self) -> int:
        if self._dtype.kind not in "iub" or self.numel() != 1:
            msg = (
                f"__index__(): only integer tensors of a single element can be converted to an index; "
                f"got {self.numel()} element(s) of dtype {self._dtype}."
            )
            raise TypeError(msg)
        return int(self.item())

    def _scalar(self, api: str) -> Any:
        if self.numel() != 1:
            msg = (
                f"{api}(): only one element tensors can be converted to Python scalars; got "
                f"{self.numel()} elements. Index one element first."
            )
            raise ValueError(msg)
        return self.item()

    def __len__(self) -> int:
        if not self._shape:
            msg = "len() of a 0-d tensor; it has no first dimension. Use item() for its value."
            raise TypeError(msg)
        return self._shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        if not self._shape:
            msg = (
                "iteration over a 0-d tensor; it has no first dimension. Use item() for its value."
            )
            raise TypeError(msg)
        return iter(self.unbind(0))

    def __getitem__(self, key: Any) -> Tensor:
        basic = parse_index(key, self._shape, self._strides, "__getitem__", _index_values)
        view = self._view(self._offset + basic.offset, basic.shape, basic.strides)
        if not basic.advanced:
            return view
        return view._gather_advanced(basic.advanced)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check_writable("__setitem__")
        if key is False:
            return  # PyTorch 2.13 skips the assignment, value unchecked
        if key is True:
            key = None  # PyTorch assigns through an unsqueezed view here, casting the value
        basic = parse_index(key, self._shape, self._strides, "__setitem__", _index_values)
        view = self._view(self._offset + basic.offset, basic.shape, basic.strides)
        if not basic.advanced:
            if isinstance(value, (builtins.bool, int, builtins.float, complex)):
                # PyTorch writes a scalar through copy_ here (fill_ itself allows overlap).
                view._check_no_internal_overlap("__setitem__")
            view._assign(value, "__setitem__")
            return
        view._index_shape(basic.advanced, "__setitem__")  # a shape mismatch is reported first
        for a in basic.advanced:  # then an index into an empty dimension, before the dtypes
            if a.values and view._shape[a.dim] == 0:
                msg = (
                    f"__setitem__(): index is out of bounds for dimension with size 0 (dimension "
                    f"{a.dim} of the indexed shape {list(view._shape)}); an empty dimension "
                    f"takes only an empty index."
                )
                raise IndexError(msg)
        if (
            isinstance(value, Tensor)
            and value._dtype is not self._dtype
            and not (basic.single_mask and value.numel() == 1)
        ):
            # PyTorch 2.13's index_put_ refuses to cast (basic-index assignment does cast), except
            # for one mask and a one-element value, which it writes with masked_fill_.
            msg = (
                f"__setitem__(): Index put requires the source and destination dtypes match, got "
                f"{self._dtype} for the destination and {value._dtype} for the source. Convert the "
                f"value with to({self._dtype}) first."
            )
            raise RuntimeError(msg)
        blocks, out_shape, post_shape, post_strides = view._advanced_blocks(
            basic.advanced, "__setitem__"
        )
        source = _as_source(value, self._dtype, "__setitem__")
        source = _expand_source(source, out_shape, "__setitem__").to(self._dtype)
        data = memoryview(source._bytes("__setitem__"))
        mv = self._storage.host_view("__setitem__")
        block_bytes = math.prod(post_shape) * self._dtype.itemsize
        for i, base in enumerate(blocks):
            _memory.scatter(
                mv,
                base,
                post_strides,
                post_shape,
                self._dtype.itemsize,
                data[i * block_bytes : (i + 1) * block_bytes],
            )

    def _index_shape(self, advanced: Sequence[Advanced], api: str) -> tuple[int, ...]:
        """The broadcast shape of the index arrays; IndexError (PyTorch's text) when they clash."""
        shapes = [a.shape for a in advanced]
        try:
            return _layout.broadcast_shapes(*shapes, api=api)
        except ValueError:
            msg = (
                f"{api}(): shape mismatch: indexing tensors could not be broadcast together with shapes "
                f"{', '.join(str(list(s)) for s in shapes)}. Give the index tensors broadcastable shapes."
            )
            raise IndexError(msg) from None

    def _advanced_blocks(
        self, advanced: Sequence[Advanced], api: str
    ) -> tuple[list[int], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Element offsets of each copied block, the result shape, and the block layout.

        NumPy's rule: when the advanced dims are adjacent, the broadcast index shape replaces them in
        place; otherwise it goes first.
        """
        bshape = self._index_shape(advanced, api)
        advanced = [
            Advanced(
                a.dim, tuple(check_index_bounds(a.values, self._shape[a.dim], a.dim, api)), a.shape
            )
            for a in advanced
        ]
        index_lists = [_broadcast_values(a.values, a.shape, bshape) for a in advanced]
        adv_dims = [a.dim for a in advanced]
        rest = [d for d in range(self.ndim) if d not in adv_dims]
        adjacent = adv_dims == list(range(adv_dims[0], adv_dims[0] + len(adv_dims)))
        pre = [d for d in rest if d < adv_dims[0]] if adjacent else []
        post = [d for d in rest if d not in pre]
        adv_strides = [self._strides[d] for d in adv_dims]
        adv_offsets = (
            [sum(i * s for i, s in zip(idx, adv_strides)) for idx in zip(*index_lists)]
            if index_lists and index_lists[0]
            else []
        )
        pre_ranges = [range(self._shape[d]) for d in pre]
        pre_strides = [self._strides[d] for d in pre]
        blocks = [
            self._offset + sum(i * s for i, s in zip(p, pre_strides)) + a
            for p in itertools.product(*pre_ranges)
            for a in adv_offsets
        ]
        out_shape = (*[self._shape[d] for d in pre], *bshape, *[self._shape[d] for d in post])
        return (
            blocks,
            out_shape,
            tuple(self._shape[d] for d in post),
            tuple(self._strides[d] for d in post),
        )

    def _gather_advanced(self, advanced: Sequence[Advanced]) -> Tensor:
        blocks, out_shape, post_shape, post_strides = self._advanced_blocks(advanced, "__getitem__")
        mv = self._storage.host_view("__getitem__")
        itemsize = self._dtype.itemsize
        out = bytearray()
        for base in blocks:
            out += _memory.gather(mv, base, post_strides, post_shape, itemsize)
        return _from_bytes(out, out_shape, self._dtype, self.device, self._requires_grad)

    def _assign(self, value: Any, api: str) -> None:
        """Write a scalar, a tensor or nested sequence into every element of this view (broadcasting)."""
        if isinstance(value, (builtins.bool, int, builtins.float, complex)):
            self._fill(value, api)
        else:
            self._copy_from(_as_source(value, self._dtype, api), api)

    def _fill(self, value: Any, api: str) -> None:
        _codec.check_scalar(self._dtype, value, api, numel=self.numel())
        self._fill_element(_codec.pack(self._dtype, [value]), api)

    def _fill_element(self, element: bytes, api: str) -> None:
        """Write one packed element to every position (stride-0 source)."""
        self._check_writable(api)
        mv, offset, strides, shape, itemsize = self._region(api)
        _memory.copy_region(
            mv, offset, strides, memoryview(element), 0, (0,) * len(shape), shape, itemsize
        )

    def fill_(self, value: Any) -> Tensor:
        """Set every element to ``value`` (a Python scalar or a one-element tensor)."""
        if isinstance(value, Tensor):
            if value.ndim != 0:
                msg = (
                    f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} "
                    f"dimensions."
                )
                raise RuntimeError(msg)
            value = value.item()
        self._fill(value, "fill_")
        return self

    def zero_(self) -> Tensor:
        """Set every element to all-zero bytes, as PyTorch's ``zero_`` (a memset: it works for every dtype)."""
        self._fill_element(bytes(self._dtype.itemsize), "zero_")
        return self

    def copy_(self, src: Any, non_blocking: bool = False) -> Tensor:
        """Copy ``src`` (broadcast to this shape, converted to this dtype) into this tensor's memory.

        Args:
            src: a tensor or anything `tensorbridge.tensor` takes.
            non_blocking: accepted for PyTorch's signature; host copies are always synchronous.
        """
        self._check_writable("copy_")
        source = _as_source(src, self._dtype, "copy_")
        _check_copy_shapes(self._shape, source._shape)
        self._copy_from(source, "copy_")
        return self

    def _check_no_internal_overlap(self, api: str) -> None:
        if self.numel() > 1 and any(n > 1 and st == 0 for n, st in zip(self._shape, self._strides)):
            # PyTorch's check (at::assert_no_internal_overlap): which source element would win is
            # arbitrary. A fill writes one value everywhere, so fill_ stays allowed, as in PyTorch.
            msg = (
                f"{api}(): unsupported operation: more than one element of the written-to tensor refers "
                f"to a single memory location. Please clone() the tensor before performing the operation."
            )
            raise RuntimeError(msg)

    def _copy_from(self, src: Tensor, api: str) -> None:
        self._check_writable(api)
        self._check_no_internal_overlap(api)
        src = _expand_source(src, self._shape, api)
        dst_mv = self._storage.host_view(api)
        itemsize = self._dtype.itemsize
        if src._dtype is not self._dtype:
            data = _cast(src, self._dtype, api)
            _memory.scatter(dst_mv, self._offset, self._strides, self._shape, itemsize, data)
        elif _overlaps(self, src):
            _memory.scatter(
                dst_mv, self._offset, self._strides, self._shape, itemsize, src._bytes(api)
            )
        else:
            src_mv = src._storage.host_view(api)
            _memory.copy_region(
                dst_mv,
                self._offset,
                self._strides,
                src_mv,
                src._offset,
                src._strides,
                self._shape,
                itemsize,
            )

    # ------------------------------------------------------------------ copies and casts
    def contiguous(self) -> Tensor:
        """This tensor if already row-major compact, else a compact copy."""
        if self.is_contiguous():
            return self
        return self.clone()

    def clone(self) -> Tensor:
        """A compact copy in new tensorbridge memory (writable, even if this tensor is read-only)."""
        return _from_bytes(
            self._bytes("clone"), self._shape, self._dtype, self.device, self._requires_grad
        )

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """Convert dtype and/or device: ``to(dtype)``, ``to(device)``, ``to(other)``, ``to(device, dtype)``.

        Returns ``self`` when nothing changes and ``copy`` is False. Values follow `_codec`'s cast rules:
        PyTorch's results for every value the target can represent, one documented rule otherwise.
        """
        dtype, device, copy = _parse_to_args(self, args, kwargs)
        if dtype is self._dtype and device == self.device and not copy:
            return self
        if device != self.device and not (
            device.is_host_accessible and self.device.is_host_accessible
        ):
            msg = (
                f"to(): cannot move a tensor from {self.device} to {device}: tensorbridge does not copy "
                f"between devices. Export it with __dlpack__(dl_device=...) to a library that can."
            )
            raise BufferError(msg)
        if dtype is self._dtype:
            return _from_bytes(self._bytes("to"), self._shape, dtype, device, self._requires_grad)
        data = _cast(self, dtype, "to")
        return _from_bytes(
            data, self._shape, dtype, device, self._requires_grad and dtype.kind in "fc"
        )

    def type(self, dtype: DType | None = None) -> Any:
        """The dtype's name without ``dtype``; with it, `to(dtype)` (PyTorch's ``type``).

        Args:
            dtype: the dtype to convert to; None returns the name (``'tensorbridge.float32'``,
                not PyTorch's ``'torch.FloatTensor'``).
        """
        if dtype is None:
            return repr(self._dtype)
        return self.to(dtype)

    def numpy(self, *, force: bool = False) -> Any:
        """A NumPy array sharing this tensor's memory (needs NumPy), as ``torch.Tensor.numpy``.

        The array keeps this tensor's memory alive; a read-only tensor gives a read-only array.
        bfloat16, complex32 and the float8 types become ml_dtypes arrays (needs ml_dtypes).

        Args:
            force: convert a tensor that requires grad too (PyTorch's meaning: as if detached).
                Without it such a tensor is refused with PyTorch's `RuntimeError`. The memory is
                shared either way: NumPy represents every host layout tensorbridge has, so
                ``force`` never makes a copy here (PyTorch's may copy, for other devices).
        """
        return _peers.to_numpy(self, force=force)

    # ------------------------------------------------------------------ comparisons
    def equal(self, other: Tensor) -> bool:
        """True when shapes and values are equal (NaN is never equal), as ``torch.equal``."""
        return equal(self, other)

    def __eq__(self, other: object) -> Any:
        msg = (
            "Tensor.__eq__: elementwise comparison is arithmetic, which tensorbridge leaves to the "
            "frameworks; use tensorbridge.equal(a, b) or compare tolist()."
        )
        raise TypeError(msg)

    __hash__ = object.__hash__

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        return _format.format_tensor(self)

    __str__ = __repr__

    # ------------------------------------------------------------------ protocols (one module each)
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: Any = None,
    ) -> Any:
        """Export as a DLPack capsule (versioned for ``max_version >= (1, 0)``); see `_dlpack`."""
        return _dlpack_export.dlpack_export(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[Any, int]:
        """``(DLDeviceType, device_id)`` of this tensor's memory."""
        return self._storage.device.to_dlpack()

    def __arrow_c_schema__(self) -> Any:
        """An ``"arrow_schema"`` capsule of this tensor's Arrow type; see `_arrow_export`."""
        return _arrow_export.export_schema(self._shape, self._dtype)

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        """Arrow PyCapsules sharing this memory (``pyarrow.array(t)``): 1-d as a primitive array,
        n-d as ``arrow.fixed_shape_tensor``; bool and non-contiguous layouts are copied. See
        `_arrow_export`."""
        return _arrow_export.export_array(
            self._storage,
            self._offset,
            self._shape,
            self._strides,
            self._dtype,
            self._requires_grad,
            requested_schema,
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _rebuild_from_buffer if protocol >= 5 else _rebuild_tensor, _pickle.reduce_args(
            self, protocol
        )

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy's array interface (version 3) for host memory; see `_buffer`."""
        return _interface_export.array_interface(self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3); CPU tensors do not have it (AttributeError)."""
        return _interface_export.cuda_array_interface(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        """NumPy's last protocol: dtypes and memory ``__array_interface__`` cannot give (ml_dtypes
        arrays for bfloat16, float8 and complex32; a TypeError otherwise); see `_interfaces`."""
        return _peers.numpy_array(self, dtype, copy)

    def __buffer__(self, flags: int) -> memoryview:
        """PEP 688 buffer export (Python 3.12+): ``memoryview(t)``."""
        return _buffer_export.buffer_export(self, flags)

    def as_memoryview(self) -> memoryview:
        """A memoryview of this tensor's memory on every Python version (contiguous tensors only)."""
        return _buffer_export.buffer_export(self, 0)

    def share_memory_(self) -> Tensor:
        """Move the storage into shared memory another process can map; returns ``self``."""
        _shared.share_memory(self)
        _shared.register_process_reducer(Tensor, _reduce_for_process)
        return self

    def torch(self, *, force: bool = False) -> Any:
        """A ``torch.Tensor`` sharing this memory, keeping ``requires_grad`` (needs PyTorch).

        Args:
            force: hand PyTorch a copy where it cannot share this memory: read-only tensors
                (PyTorch has none, and would write through) and negative strides (PyTorch aborts
                on them). Without it those are a `BufferError`; other tensors are shared either way.
        """
        return _peers.to_torch(self, force=force)

    def jax(self) -> Any:
        """A ``jax.Array`` from this memory (needs JAX; JAX may copy unless 64-byte aligned)."""
        return _peers.to_jax(self)


# ---------------------------------------------------------------------- helpers
def _warn_zero_d(name: str, hint: str) -> None:
    """PyTorch 2.13's deprecation warning for ``T``/``mT`` of a 0-d tensor (UserWarning, its words)."""
    warn_user(f"Tensor.{name} is deprecated on 0-D tensors. {hint}")


def _layout_args(args: Sequence[Any], api: str) -> tuple[int, ...]:
    """``f(2, 3)`` or ``f((2, 3))``: a tuple of ints, negative values allowed (checked by the caller)."""
    if len(args) == 1 and not isinstance(args[0], int) and hasattr(args[0], "__iter__"):
        args = tuple(args[0])
    out = []
    for a in args:
        if isinstance(a, builtins.bool) or not hasattr(a, "__index__"):
            msg = f"{api}(): sizes must be ints; got {a!r} ({type(a).__name__})."
            raise TypeError(msg)
        out.append(_layout.check_int64(a.__index__(), api, "size or stride"))
    return tuple(out)


def _nest(values: list[Any], shape: Sequence[int]) -> Any:
    if not shape:
        return values[0]
    for size in reversed(shape[1:]):
        values = (
            [values[i : i + size] for i in range(0, len(values), size)]
            if size
            else [[] for _ in range(len(values) // max(size, 1))]
        )
    if len(shape) > 1 and 0 in shape[1:]:
        return _empty_nest(shape)
    return values


def _empty_nest(shape: Sequence[int]) -> Any:
    """Lists nested as a size-0 ``shape`` says, each list made at its full length first: a length
    no list can hold is a MemoryError at once, as in PyTorch's ``tolist`` (``PyList_New``)."""
    if len(shape) == 1:
        return []
    out: list[Any] = [None] * shape[0]
    inner = shape[1:]
    for i in range(shape[0]):
        out[i] = _empty_nest(inner)
    return out


def _broadcast_values(
    values: Sequence[int], shape: tuple[int, ...], target: tuple[int, ...]
) -> list[int]:
    if shape == target:
        return list(values)
    strides = _layout.expand_strides(
        shape, _layout.contiguous_strides(shape), target, "__getitem__"
    )
    return [
        values[sum(i * s for i, s in zip(idx, strides))]
        for idx in itertools.product(*(range(n) for n in target))
    ]


def _expand_source(src: Tensor, shape: Sequence[int], api: str) -> Tensor:
    """``src`` broadcast to ``shape`` (a view); leading size-1 dims beyond ``shape`` are dropped first.

    NumPy and PyTorch both accept ``t[...] = value`` with a value of shape ``(1, n)`` for a target of
    shape ``(n,)``; a mismatch raises `expand`'s message (PyTorch's text for ``__setitem__``).
    """
    lead = 0
    while src.ndim - lead > len(shape) and src._shape[lead] == 1:
        lead += 1
    src_shape, src_strides = src._shape[lead:], src._strides[lead:]
    strides = _layout.expand_strides(src_shape, src_strides, shape, api)
    return Tensor._new(src._storage, src._offset, shape, strides, src._dtype, checked=True)


def _check_copy_shapes(dst: Sequence[int], src: Sequence[int]) -> None:
    """``copy_``'s broadcast rule, with PyTorch's messages: ``src`` must broadcast to exactly ``dst``."""
    ndim = max(len(dst), len(src))
    out = []
    for i in range(ndim - 1, -1, -1):
        a = dst[i - ndim + len(dst)] if i >= ndim - len(dst) else 1
        b = src[i - ndim + len(src)] if i >= ndim - len(src) else 1
        if a != b and 1 not in (a, b):
            msg = (
                f"copy_(): The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                f"non-singleton dimension {i}; got destination shape {list(dst)} and source shape "
                f"{list(src)}. Give the source a shape that broadcasts to the destination."
            )
            raise RuntimeError(msg)
        out.append(b if a == 1 else a)
    if tuple(reversed(out)) != tuple(dst):
        msg = (
            f"copy_(): output with shape {list(dst)} doesn't match the broadcast shape "
            f"{list(reversed(out))}. Give the source a shape that broadcasts to the destination."
        )
        raise RuntimeError(msg)


def _cast(src: Tensor, dtype: DType, api: str) -> bytes:
    """``src``'s elements converted to ``dtype``, packed row-major (the one cast path)."""
    if _dtype.float4_e2m1fn_x2 in (src.dtype, dtype):
        # PyTorch has no conversion for packed FP4 either ("copy_" not implemented for 'Float4_e2m1fn_x2').
        msg = (
            f"{api}(): cannot convert between {src.dtype} and {dtype}: packed float4_e2m1fn_x2 has no "
            f"element conversion. Reinterpret the bytes with view(tensorbridge.uint8) instead."
        )
        raise NotImplementedError(msg)
    return _codec.pack(dtype, src._values(api))


def _overlaps(a: Tensor, b: Tensor) -> bool:
    """True when two host layouts may share bytes (a conservative byte-range test)."""
    ea = _layout.extent(a._offset, a._shape, a._strides)
    eb = _layout.extent(b._offset, b._shape, b._strides)
    if ea is None or eb is None:
        return False
    a_lo, a_hi = a._storage.ptr + ea[0] * a.itemsize, a._storage.ptr + (ea[1] + 1) * a.itemsize
    b_lo, b_hi = b._storage.ptr + eb[0] * b.itemsize, b._storage.ptr + (eb[1] + 1) * b.itemsize
    return a_lo < b_hi and b_lo < a_hi


def _from_bytes(
    data: bytes | bytearray,
    shape: Sequence[int],
    dtype: DType,
    device: Device = CPU,
    requires_grad: bool = False,
) -> Tensor:
    """A new compact tensor in tensorbridge memory holding ``data`` (row-major packed elements)."""
    storage = allocate(len(data), device if device.is_host_accessible else CPU)
    if data:
        storage.host_view("clone")[:] = data
    strides = _layout.contiguous_strides(shape)
    return Tensor._new(storage, 0, shape, strides, dtype, requires_grad=requires_grad, checked=True)


def _as_source(value: Any, dtype: DType, api: str) -> Tensor:
    """A tensor to copy from: tensors as they are, anything else converted with `tensor`."""
    if isinstance(value, Tensor):
        return value
    return _as_tensor(value, dtype, "tensor")


def _index_values(item: Any, api: str) -> tuple[list[Any], tuple[int, ...], str] | None:
    """Flatten an index array (a Tensor, a list, anything with ``tolist``) to (values, shape, kind).

    ``kind`` is ``"b"`` for a mask (bool, or uint8 as PyTorch reads it) and ``"i"`` for indices.
    """
    if isinstance(item, Tensor):
        dtype = item.dtype
        # PyTorch 2.13: index tensors of one or more dims must be int64, int32, uint8 (a mask) or
        # bool; a 0-d one may be of any integer type (it selects) or bool/uint8 (a bool index).
        allowed = dtype.kind in "biu" if item.ndim == 0 else dtype.name in INDEX_DTYPES
        if not allowed:
            msg = (
                f"{api}(): tensors used as indices must be long, int, byte or bool tensors; "
                f"got a {item.ndim}-d tensor of dtype {dtype}."
            )
            raise IndexError(msg)
        flat = item.reshape(-1).tolist()
        if dtype.name == "uint8":
            if item.ndim:  # a 0-d uint8 tensor is a bool, without the warning, as in PyTorch
                warn_user(UINT8_INDEX_WARNING)
            return [v != 0 for v in flat], tuple(item.shape), "b"
        return flat, tuple(item.shape), "b" if dtype.kind == "b" else "i"
    if isinstance(item, list):
        try:
            t = _as_tensor(item, None, "tensor")
        except (TypeError, ValueError, RuntimeError) as exc:
            msg = f"{api}(): invalid index {item!r}; index lists must hold ints or bools."
            raise IndexError(msg) from exc
        if t.numel() == 0 and t.dtype.kind == "f":
            return [], tuple(t.shape), "i"  # [] indexes nothing, as in PyTorch
        return _index_values(t, api)
    if (hasattr(item, "__array_interface__") or hasattr(item, "__dlpack__")) and hasattr(
        item, "__len__"
    ):
        # Keep the producer's dtype: a NumPy or PyTorch uint8 array is a mask, as in PyTorch.
        # Arrays have __len__; NumPy scalars other than integers (np.bool_, np.float64) do not,
        # and PyTorch refuses them as indices.
        try:
            t = _as_tensor(item, None, "tensor")
        except (TypeError, ValueError, BufferError) as exc:
            msg = f"{api}(): invalid index {item!r}; index arrays must hold ints or bools."
            raise IndexError(msg) from exc
        return _index_values(t, api)
    return None


def _no_converter(value: Any, dtype: DType | None, api: str) -> Tensor:
    msg = f"{api}(): tensorbridge._convert is not loaded; import tensorbridge first."
    raise RuntimeError(msg)


# Converting any array-like into a tensor (`tensorbridge.tensor`) is `_convert`'s work, above this
# module. It hands its converter down when it is loaded (`set_converter`; `import tensorbridge`
# loads it), so that the `Tensor` methods taking array-likes (``t[...] = value``, `copy_`, indexing
# with lists and arrays) convert them without an import pointing up.
_as_tensor: Callable[[Any, DType | None, str], Tensor] = _no_converter


def set_converter(convert: Callable[[Any, DType | None, str], Tensor]) -> None:
    """Install ``convert(value, dtype, api)``, `_convert`'s `tensor`, for the methods above."""
    global _as_tensor  # noqa: PLW0603  (installed once, when _convert loads)
    _as_tensor = convert


def _parse_to_args(
    t: Tensor, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[DType, Device, bool]:
    dtype, device = t.dtype, t.device
    copy = builtins.bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    for a in args:
        if isinstance(a, DType):
            dtype = a
        elif isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, (str, Device)):
            device = as_device(a, "to")
        elif isinstance(a, builtins.bool):
            copy = a
        elif (foreign := foreign_dtype(a, "to")) is not None:
            dtype = foreign
        else:
            msg = f"to(): expected a dtype, a device or a tensor; got {a!r} ({type(a).__name__})."
            raise TypeError(msg)
    if "dtype" in kwargs and kwargs["dtype"] is not None:
        dtype = as_dtype(kwargs.pop("dtype"), "to")
    if "device" in kwargs and kwargs["device"] is not None:
        device = as_device(kwargs.pop("device"), "to")
    kwargs.pop("dtype", None)
    kwargs.pop("device", None)
    if kwargs:
        msg = f"to(): unexpected keyword argument {next(iter(kwargs))!r}; accepted: dtype, device, copy."
        raise TypeError(msg)
    return dtype, device, copy


def equal(a: Tensor, b: Tensor) -> bool:
    """True when ``a`` and ``b`` have the same shape and equal values (``torch.equal``; NaN != NaN)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        msg = (  # type: ignore[unreachable]  # checked at run time too
            f"equal(): expected two tensors; got {type(a).__name__} and {type(b).__name__}. "
            f"Convert with tensorbridge.asarray() first."
        )
        raise TypeError(msg)
    if a.shape != b.shape:
        return False
    return all(x == y for x, y in zip(a._values("equal"), b._values("equal")))


# ---------------------------------------------------------------------------------------------- pickles
# The functions a pickle names to rebuild a tensor live beside the class; `_pickle` and `_shared`
# (below) supply the storages. What a pickle says is checked first (`_pickle.checked_layout`:
# types, a known dtype, one stride per size), and each layout goes through `Tensor._new`: a crafted
# pickle cannot reach outside its storage.
def _rebuild_tensor(
    data: Any,
    dtype_name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    readonly: bool,
    requires_grad: bool,
) -> Tensor:
    """Unpickle protocols 0 to 4 (and protocol 5 pickles written before `_rebuild_from_buffer`).

    A tensor over ``data`` (bytes, bytearray, PickleBuffer, ...); a writable copy when the tensor
    was writable and ``data`` is not.
    """
    dtype, shape, strides, offset, readonly, requires_grad = _pickle.checked_layout(
        dtype_name, shape, strides, offset, readonly, requires_grad
    )
    storage = _pickle.storage_over(data, readonly)
    return _rebuilt(storage, dtype, shape, strides, offset, requires_grad)


def _rebuild_from_buffer(
    data: Any,
    dtype_name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    readonly: bool,
    requires_grad: bool,
    reader: _pickle.Reader = _pickle.PICKLE,
) -> Tensor:
    """Unpickle protocol 5: a tensor over ``data``'s memory, never a copy (see `_pickle`); also
    `_shareable.from_shareable`'s rebuild, whose ``reader`` names it in refusals."""
    dtype, shape, strides, offset, readonly, requires_grad = _pickle.checked_layout(
        dtype_name, shape, strides, offset, readonly, requires_grad, reader
    )
    storage = _pickle.buffer_storage(data, readonly, reader)
    return _rebuilt(storage, dtype, shape, strides, offset, requires_grad, reader.api)


def _reduce_for_process(t: Tensor) -> tuple[Any, tuple[Any, ...]]:
    """``multiprocessing``'s reducer: shared-memory tensors by segment name, others as pickles."""
    args = _shared.process_args(t)
    if args is None:
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return _rebuild_shared, args


def _rebuild_shared(
    name: str,
    nbytes: int,
    dtype_name: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    readonly: bool,
    requires_grad: bool,
) -> Tensor:
    """Unpickle a shared-memory tensor: map the segment by name (every process sees each write).

    Every argument is checked before anything is opened (`_shared.checked_name`: a name
    tensorbridge sends, on Linux a pickle's own link; `_pickle.checked_nbytes`;
    `_pickle.checked_layout`); the name is then proved a link of a segment and mapped
    (`_shared.attach_storage`), the layout is checked against it (`Tensor._new`), and only then
    does this process take the name over (`_shared.take_name`, on Linux): a refused pickle leaves
    every name as it found it.
    """
    name = _shared.checked_name(name)
    nbytes = _pickle.checked_nbytes(nbytes)
    dtype, shape, strides, offset, readonly, requires_grad = _pickle.checked_layout(
        dtype_name, shape, strides, offset, readonly, requires_grad
    )
    storage = _shared.attach_storage(name, nbytes, readonly)
    t = _rebuilt(storage, dtype, shape, strides, offset, requires_grad)
    _shared.take_name(storage)
    _shared.register_process_reducer(Tensor, _reduce_for_process)  # sent on by name from here too
    return t


def _rebuilt(
    storage: Storage,
    dtype: DType,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    requires_grad: bool,
    api: str = "pickle.loads",
) -> Tensor:
    t = Tensor._new(storage, offset, shape, strides, dtype, api)
    if requires_grad:
        t.requires_grad_(True)
    return t
