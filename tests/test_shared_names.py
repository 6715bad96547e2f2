"""Shared-memory names a pickle carries: only a proved link is taken over; a refusal touches nothing.

The rule (``tensorbridge._shared``'s module docstring): a name in /dev/shm is unlinked only by the
process that made it, or by a process that received it as a pickle's own link and proved it one; a
name is proved before it is taken over, and a refused pickle leaves every name as it found it. So a
pickle that names a segment's first name (its owner's), a name with a NUL byte or a slash, a file
of another program, or a file that only looks like a link is refused before anything is opened or
unlinked, and so is one whose byte count, layout or sizes are wrong. Each check lists the names in
/dev/shm before and after, and then has the owner send its tensor again (which needs its first
name) and loads the genuine pickle (which needs its link).

The checks run in this process: a refusal opens, maps and unlinks nothing that could crash it, and
each check cleans up the names it made.
"""

from __future__ import annotations

import gc
import os
import pickle
import re
import sys
from multiprocessing import resource_tracker
from multiprocessing.reduction import ForkingPickler

import pytest

import tensorbridge as tb
from tensorbridge import _shared, _tensor

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a name per pickle needs /dev/shm (Linux)"
)

SHM = "/dev/shm"
FIX = "The pickle was damaged or altered after tensorbridge wrote it; pickle the tensor again."
UNTOUCHED = "nothing was opened or unlinked"
LEFT = "it was left as it was"


class _Sent:
    """Pickles as ``multiprocessing`` sends a shared tensor, with the arguments given:
    ``pickle.loads`` runs the real rebuild function."""

    def __init__(self, *args: object) -> None:
        self.args = args

    def __reduce__(self):
        return _tensor._rebuild_shared, self.args


def _loads(*args: object) -> tb.Tensor:
    return pickle.loads(pickle.dumps(_Sent(*args)))


def _names(first: str) -> list[str]:
    """The segment's names in /dev/shm: its first name and its links."""
    return sorted(n for n in os.listdir(SHM) if n.partition(".")[0] == first)


def _state(path: str) -> tuple[int, int, int, int] | None:
    """What a test's file in /dev/shm is (inode, links, size, mode), or None once it is gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_nlink, st.st_size, st.st_mode


@pytest.fixture
def owner():
    """A tensor this process moved into shared memory (it owns the first name); links of its
    segment a check left are unlinked afterwards, and unregistered from the resource tracker."""
    t = tb.arange(16, dtype=tb.int32).share_memory_()
    first = t._storage.owner.name
    yield t
    del t
    gc.collect()
    for name in _names(first):
        if name != first and name not in _shared._OWNED:
            os.unlink(os.path.join(SHM, name))
            resource_tracker.unregister("/" + name, "shared_memory")


@pytest.fixture
def foreign():
    """Files a check makes in /dev/shm (``foreign(name)`` gives the path); removed afterwards."""
    made: list[str] = []

    def make(name: str) -> str:
        path = os.path.join(SHM, name)
        made.append(path)
        return path

    yield make
    for path in made:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)


def _genuine(t: tb.Tensor) -> tuple[object, ...]:
    """The arguments of a pickle ``multiprocessing`` makes of ``t``: its own link, the layout."""
    args = _shared.process_args(t)
    assert args is not None
    return args


def _refused(error: type[Exception], words: str, *args: object) -> str:
    """Load a pickle of ``args``: it must raise ``error`` in a pickle's words, with ``words``."""
    with pytest.raises(error) as info:
        _loads(*args)
    text = str(info.value)
    assert text.startswith("pickle.loads(): "), text
    assert words in text, text
    assert text.endswith(FIX), text
    gc.collect()  # whatever the refused pickle left behind dies now, and would unlink now
    return text


def _still_works(t: tb.Tensor, genuine: tuple[object, ...]) -> None:
    """The owner still sends its tensor (a new link, made from its first name), and the genuine
    pickle still loads (its link is there): each receiver writes into the owner's memory, and
    unlinks its link with itself; the first name stays."""
    first = t._storage.owner.name
    before = _names(first)
    assert first in before and genuine[0] in before
    sent = ForkingPickler.loads(ForkingPickler.dumps(t))
    sent[0] = 100
    received = _loads(*genuine)
    received[1] = 101
    assert t[:3].tolist() == [100, 101, 2]
    links = [sent._storage.owner.name, received._storage.owner.name]
    assert [n.partition(".")[0] for n in links] == [first, first]
    assert set(links) <= set(_names(first))
    del sent, received
    gc.collect()
    assert _names(first) == [n for n in before if n != genuine[0]]


# -------------------------------------------------------------------------------------------------
# Names a pickle must not make a receiver take over


def test_a_first_name_is_refused_and_left_to_its_owner(owner):
    """The owner's first name in a pickle (as pickles carried before per-pickle links): refused
    before it is opened, so the owner keeps it and can still send its tensor."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    before = _names(first)
    assert len(before) == 2  # the first name and the genuine pickle's link
    text = _refused(
        ValueError,
        f"the shared-memory name {first!r} is a segment's first name",
        first,
        *genuine[1:],
    )
    assert f"; {UNTOUCHED}. " in text
    assert _names(first) == before
    assert _shared._OWNED[first] is owner._storage.owner._shm  # still this process's, as made
    _still_works(owner, genuine)


def test_a_name_with_a_nul_byte_is_refused(owner):
    """The first name and a NUL byte (``shm_open`` would read the name up to the NUL, the owner's
    first name): refused, the owner's names untouched."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    before = _names(first)
    for name in (first + "\x00x", genuine[0] + "\x00", "\x00" + genuine[0]):
        text = _refused(
            ValueError,
            f"the shared-memory name {name!r} is not one tensorbridge sends",
            name,
            *genuine[1:],
        )
        assert f"; {UNTOUCHED}. " in text
        assert _names(first) == before
    _still_works(owner, genuine)


def _bad_names(first: str, link: str) -> list[str]:
    """Strings that are not a pickle's link: other programs' names, paths, near misses."""
    token = link.partition(".")[2]
    return [
        "",
        "sem.tensorbridge-test",  # a POSIX semaphore's file
        "pulse-shm-1234",
        f"{first}/",
        f"../shm/{link}",
        f"/{link}",
        f"./{link}",
        f"{link}/",
        f"{link}\n",
        f"{link}.{token}",  # a link of a link
        f"{first}.{token[:-1]}",  # a token too short
        f"{first}.{token}0",  # too long
        f"{first}.{token.upper()}",  # tensorbridge writes lowercase hex
        f"{first.upper()}.{token}",
        f"{first}_{token}",
        f"{first}.{token[:-1]}g",
        f"psm_{first[4:-1]}.{token}",  # a first name too short
        f"tbs_{first[4:]}.{token}",
        link + "x" * 10_000,  # bounded: a long name is refused by its syntax
        f"{first}.{'٣' * 16}",  # digits, but not ASCII ones
    ]


def test_names_tensorbridge_does_not_make_are_refused(owner, foreign):
    """Every name but a pickle's link, such as another program's file in /dev/shm: refused with
    the name and why, before anything is opened; the file and the segment's names untouched."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    bad = _bad_names(first, str(genuine[0]))
    # Another program's file in /dev/shm, with contents, under a name it might use.
    path = foreign(f"tbtest-{os.getpid()}-{os.urandom(4).hex()}")
    with open(path, "wb") as f:
        f.write(b"not a tensorbridge segment" * 100)
    # A hard link of the segment itself, under a name tensorbridge does not make.
    alias = foreign(f"tbtest-{os.getpid()}-{os.urandom(4).hex()}")
    os.link(os.path.join(SHM, first), alias)
    bad += [os.path.basename(path), os.path.basename(alias)]
    files = {p: _state(p) for p in (path, alias, os.path.join(SHM, first))}
    before = _names(first)
    for name in bad:
        text = _refused(
            ValueError,
            "is not one tensorbridge sends (a link made for one pickle: 'psm_', 8 hex digits, '.', 16 hex digits)",
            name,
            *genuine[1:],
        )
        assert "the shared-memory name " in text and f"; {UNTOUCHED}. " in text
        assert _names(first) == before, name
        assert {p: _state(p) for p in files} == files, name
    with open(path, "rb") as f:
        assert f.read() == b"not a tensorbridge segment" * 100
    _still_works(owner, genuine)


@pytest.mark.parametrize("name", [None, 5, b"psm_00000000.0000000000000000", ["psm_"], 1.5])
def test_a_name_that_is_not_a_str_is_refused(owner, name):
    """A name must be a str: bytes, numbers and lists are a TypeError, nothing opened."""
    genuine = _genuine(owner)
    before = _names(owner._storage.owner.name)
    text = _refused(
        TypeError, "a shared-memory tensor's segment name must be a str; got ", name, *genuine[1:]
    )
    assert f"({type(name).__name__})." in text
    assert _names(owner._storage.owner.name) == before
    _still_works(owner, genuine)


def _impostors(first: str, foreign, uid: int) -> dict[str, tuple[str, str]]:
    """Files in /dev/shm named as a pickle's link would be, which are no link of the segment:
    ``{what: (name, why the refusal gives)}``."""
    made = {}

    def name_for() -> str:
        name = f"{first}.{os.urandom(8).hex()}"
        foreign(name)
        return name

    # A regular file of its own, named after a live segment.
    name = name_for()
    with open(os.path.join(SHM, name), "wb") as f:
        f.write(bytes(64))
    made["a file of its own"] = (name, f"the segment {first!r} it is named after is another file")
    # A symbolic link to the segment's first name.
    name = name_for()
    os.symlink(os.path.join(SHM, first), os.path.join(SHM, name))
    made["a symbolic link"] = (name, "it is not a regular file (lrwx")
    name = name_for()
    os.mkfifo(os.path.join(SHM, name))
    made["a FIFO"] = (name, "it is not a regular file (prw")
    name = name_for()
    os.mkdir(os.path.join(SHM, name))
    made["a directory"] = (name, "it is not a regular file (drwx")
    if uid == 0:  # only root can give a file away: a link of the segment made by another user
        name = name_for()
        linked = os.path.join(SHM, name)
        with open(linked, "wb") as f:
            f.write(bytes(64))
        os.chown(linked, 12345, 12345)
        made["another user's file"] = (name, "it belongs to user 12345, not to 0")
    return made


def test_files_that_only_look_like_links_are_refused(owner, foreign):
    """A file with a link's name that is not a link of the segment (a file of its own, a symbolic
    link, a FIFO, a directory, another user's file): refused, every file left as it was."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    impostors = _impostors(first, foreign, os.geteuid())
    paths = [os.path.join(SHM, n) for n in os.listdir(SHM) if n.partition(".")[0] == first]
    paths += [os.path.join(SHM, name) for name, _ in impostors.values()]
    files = {p: _state(p) for p in paths}
    for what, (name, why) in impostors.items():
        text = _refused(
            ValueError,
            f"the shared-memory name {name!r} is not a link of a tensorbridge segment: {why}",
            name,
            *genuine[1:],
        )
        assert f"; {LEFT}. " in text, what
        assert {p: _state(p) for p in files} == files, what
    _still_works(owner, genuine)


def test_a_link_shorter_than_the_pickle_says_is_refused_and_kept(owner):
    """A genuine link whose pickle claims more bytes than the segment holds: refused, kept."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    before = _names(first)
    _refused(
        ValueError,
        f"it holds 64 bytes; the pickle says {1 << 20}",
        genuine[0],
        1 << 20,
        *genuine[2:],
    )
    assert _names(first) == before
    _still_works(owner, genuine)


def test_a_gone_name_is_a_file_not_found_error(owner):
    """A link already unlinked (by the tracker, by hand): FileNotFoundError, nothing else."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    name = f"{first}.{os.urandom(8).hex()}"
    with pytest.raises(FileNotFoundError):
        _loads(name, *genuine[1:])
    assert _names(first) == sorted([first, str(genuine[0])])
    _still_works(owner, genuine)


# -------------------------------------------------------------------------------------------------
# A genuine link with a refused layout, byte count or size is left as it was


_LAYOUTS = [
    # (what, changes to the genuine arguments, error, words)
    ("offset past the segment", {5: 1000}, ValueError, "outside the storage"),
    ("shape past the segment", {3: (17,)}, ValueError, "outside the storage"),
    ("stride past the segment", {3: (2,), 4: (16,)}, ValueError, "outside the storage"),
    ("requires_grad on int32", {7: True}, RuntimeError, "require gradients"),
    ("shape past int64", {3: (2**64,)}, ValueError, "2**63 - 1"),
    ("size-0 shape past int64", {3: (0, 2**70), 4: (1, 1)}, ValueError, "2**63 - 1"),
    ("stride past int64", {3: (1,), 4: (-(2**63),)}, ValueError, "past int64"),
    ("offset past int64", {5: 2**63}, ValueError, "0 to 2**63 - 1"),
    ("negative offset", {5: -1}, ValueError, "0 to 2**63 - 1"),
    ("unknown dtype", {2: "float128"}, ValueError, "not a tensorbridge dtype"),
    ("float shape", {3: (16.0,)}, TypeError, "shape must hold ints"),
]


@pytest.mark.parametrize(
    ("what", "changes", "error", "words"), _LAYOUTS, ids=[c[0] for c in _LAYOUTS]
)
def test_a_refused_layout_leaves_the_link(owner, what, changes, error, words):
    """The layout is checked against the segment before the name is taken over: a refused pickle
    leaves its link in /dev/shm, owned by no one in this process, and the genuine pickle loads."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    args = list(genuine)
    for i, value in changes.items():
        args[i] = value
    before = _names(first)
    with pytest.raises(error, match=re.escape(words)):
        _loads(*args)
    gc.collect()
    assert _names(first) == before, what
    assert genuine[0] not in _shared._OWNED
    _still_works(owner, genuine)


_NBYTES = [
    (-1, ValueError, "byte count (nbytes) must be 0 to 2**63 - 1; got -1"),
    (2**63, ValueError, f"byte count (nbytes) must be 0 to 2**63 - 1; got {2**63}"),
    (1.5, TypeError, "byte count (nbytes) must be an int; got 1.5 (float)"),
    (64.0, TypeError, "byte count (nbytes) must be an int; got 64.0 (float)"),
    ("x", TypeError, "byte count (nbytes) must be an int; got 'x' (str)"),
    ("64", TypeError, "byte count (nbytes) must be an int; got '64' (str)"),
    (None, TypeError, "byte count (nbytes) must be an int; got None (NoneType)"),
    (True, TypeError, "byte count (nbytes) must be an int; got True (bool)"),
]


@pytest.mark.parametrize(("nbytes", "error", "words"), _NBYTES)
def test_a_bad_byte_count_is_refused_before_anything_is_opened(owner, nbytes, error, words):
    """nbytes is an int by the pickle's rule (as_int), 0 to 2**63 - 1: anything else is refused
    in a pickle's words before the segment is opened; the link stays."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    before = _names(first)
    text = _refused(error, f"a pickled tensor's {words}. ", genuine[0], nbytes, *genuine[2:])
    assert text == f"pickle.loads(): a pickled tensor's {words}. {FIX}"
    assert _names(first) == before
    _still_works(owner, genuine)


# -------------------------------------------------------------------------------------------------
# What still works


def test_a_link_is_taken_over_once_and_unlinked_with_its_tensor(owner):
    """A genuine pickle's link is owned by its receiver from the moment its tensor is built, and
    unlinked with it; loading the same pickle twice owns it once; the first name stays."""
    first = owner._storage.owner.name
    genuine = _genuine(owner)
    link = str(genuine[0])
    u = _loads(*genuine)
    assert u._storage.owner.owns_name and _shared._OWNED[link] is u._storage.owner._shm
    v = _loads(*genuine)
    assert not v._storage.owner.owns_name  # this process owns it already, through u
    del u
    gc.collect()
    assert _names(first) == [first]
    assert v.tolist() == owner.tolist()  # the mapping outlives the name
    del v
    gc.collect()
    assert _names(first) == [first]


def test_a_link_whose_owner_has_gone_still_attaches():
    """The owner may drop its tensor (and its first name) before the receiver attaches: the
    link, its segment's last name (link count 1), is still taken over and unlinked."""
    t = tb.arange(8, dtype=tb.int64).share_memory_()
    first = t._storage.owner.name
    genuine = _genuine(t)
    del t
    gc.collect()
    assert _names(first) == [genuine[0]]
    assert os.stat(os.path.join(SHM, str(genuine[0]))).st_nlink == 1
    u = _loads(*genuine)
    assert u.tolist() == list(range(8))
    del u
    gc.collect()
    assert _names(first) == []
