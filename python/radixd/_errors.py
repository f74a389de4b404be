"""The exceptions of radixd: one ``RadixdError`` subclass per ``radixd exec``
error kind, each with ``.kind`` (the kind string) and ``.message``."""

from __future__ import annotations

from typing import Dict, Type


class RadixdError(Exception):
    """A request radixd rejected (nothing changed), or a daemon that failed.

    ``kind`` is the error kind ``radixd exec`` prints (``page_not_owned``,
    ``stale_handle``, ``daemon_gone``, ``timeout``, ...); ``message`` says why.
    """

    kind: str = "radixd"

    def __init__(self, message: str = "", kind: str | None = None):
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def _camel(kind: str) -> str:
    return "".join(part.capitalize() for part in kind.split("_")) + "Error"


# Every kind of `radixd exec` (DESIGN.md section 4 and op::ErrorKind), plus
# `not_permitted` (a daemon refusing `reset`) and the components' kinds.
# The native module may know more; those get a class at import too (see
# `register`).
KINDS = (
    "unknown_op",
    "malformed",
    "page_out_of_range",
    "page_not_owned",
    "page_count_mismatch",
    "insufficient_pages",
    "unknown_handle",
    "stale_handle",
    "not_locked",
    "unknown_session",
    "session_not_owned",
    "too_large",
    "daemon_gone",
    "timeout",
    "protocol",
    "invariant",
    "not_permitted",
    # The hybrid components (SWA, MAMBA): a component the cache was not
    # started with, a state slot the caller does not hold, SWA pages that
    # contradict `swa_evicted`, and a state pool held full.
    "component_off",
    "state_not_owned",
    "swa_mismatch",
    "insufficient_states",
    # A client of another KV buffer than the one the daemon's pool is bound
    # to (`radixd.Client(name, pool=...)`).
    "pool_mismatch",
    # A namespace name that is empty or longer than 256 bytes.
    "bad_namespace",
    # The ranks of one tensor-parallel server (`Client.join`): a rank whose
    # call differs from its group's at the same step, a join that disagrees
    # with its group, a join of a finished group or a taken rank, and a rank
    # that waited in vain for the slowest.
    "desync",
    "group_mismatch",
    "group_closed",
    "group_lag",
)

#: kind string -> exception class
ERRORS: Dict[str, Type[RadixdError]] = {}

# Kinds that are also a builtin exception, so ``except TimeoutError`` or
# ``except ConnectionError`` catch them too.
_ALSO = {"timeout": (TimeoutError,), "daemon_gone": (ConnectionError,)}


def register(kind: str) -> Type[RadixdError]:
    """The exception class of ``kind``, made on first use."""
    cls = ERRORS.get(kind)
    if cls is None:
        cls = type(
            _camel(kind),
            (RadixdError,) + _ALSO.get(kind, ()),
            {"kind": kind, "__doc__": f"radixd error kind ``{kind}``.", "__module__": "radixd"},
        )
        ERRORS[kind] = cls
    return cls


for _kind in KINDS:
    register(_kind)


def error_class(kind: str) -> Type[RadixdError]:
    """The exception class raised for ``kind`` (``RadixdError`` if unknown)."""
    return ERRORS.get(kind, RadixdError)


def make_error(kind: str, message: str) -> RadixdError:
    """The exception for a rejection of ``kind`` (called by the extension)."""
    cls = ERRORS.get(kind)
    if cls is None:
        return RadixdError(message, kind)
    return cls(message)
