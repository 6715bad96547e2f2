"""Types of the compiled `_capi_c` (see `_capi_c.pyx`)."""

def capsule_pointer(capsule: object, name: bytes | None) -> int | None: ...
def capsule_set_name(capsule: object, name: bytes | None) -> int: ...
def guarded_destructor_address() -> int: ...

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
    def __init__(self, obj: object, flags: int) -> None: ...
