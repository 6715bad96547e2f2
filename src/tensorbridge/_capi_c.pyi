"""Types of the compiled `_capi_c` (see `_capi_c.pyx`)."""

def capsule_new(pointer: int, name: bytes | None, destructor: int | None) -> object: ...
def capsule_pointer(capsule: object, name: bytes | None) -> int | None: ...
def capsule_is_valid(capsule: object, name: bytes | None) -> int: ...
def capsule_set_name(capsule: object, name: bytes | None) -> int: ...
def guarded_destructor_address() -> int: ...
def dlpack_capsule_destructor(release: object) -> int: ...

class VoidFunction:
    def __init__(self, address: int) -> None: ...
    def __call__(self, argument: int) -> None: ...

class BufferView:
    buf: int | None
    obj: int | None
    len: int
    itemsize: int
    readonly: int
    ndim: int
    format: bytes | None
    shape: tuple[int, ...] | None
    strides: tuple[int, ...] | None
    suboffsets: tuple[int, ...] | None
    def __init__(self) -> None: ...

def acquire_buffer(obj: object, flags: int) -> tuple[BufferView, int, int, bool]: ...
def describe_buffer(
    view: BufferView,
) -> tuple[
    int, int, bytes | None, int, int, tuple[int, ...] | None, tuple[int, ...] | None, bool, bool
]: ...
def new_object(cls: type) -> object: ...

class ManagedBlock: ...

def new_managed(
    versioned: bool,
    version: tuple[int, int],
    deleter: int,
    flags: int,
    data: int,
    device: tuple[int, int],
    dtype: tuple[int, int, int],
    byte_offset: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
) -> tuple[int, ManagedBlock]: ...
