"""A client of ``radixd index serve`` (docs/routing.md): per-worker overlap
scores from a running index, over its ZeroMQ REQ/REP socket with msgpack.

Needs ``pyzmq`` and ``msgspec`` (imported when a client is made, so
``import radixd`` does not need them). In-process, use
:class:`radixd.KvIndex` instead.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence


class IndexQueryError(Exception):
    """The index answered ``{"ok": false, ...}``; ``.kind`` is its ``error``."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class IndexClient:
    """``IndexClient("tcp://127.0.0.1:5600", timeout=5.0)``.

    :meth:`query` answers as ``radixd index query`` prints:
    ``{"ok": True, "scores": {name: blocks}, "tree_sizes": {name: blocks}}``.
    A timeout raises :class:`TimeoutError`; an error answer
    :class:`IndexQueryError`.
    """

    def __init__(self, endpoint: str, timeout: float = 5.0):
        try:
            import msgspec
            import zmq
        except ImportError as e:  # pragma: no cover - depends on the env
            raise ImportError("radixd.IndexClient needs pyzmq and msgspec") from e
        self._msgpack = msgspec.msgpack
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REQ)
        self._sock.setsockopt(zmq.LINGER, 0)
        # After a timeout the next request may still go out.
        self._sock.setsockopt(zmq.REQ_RELAXED, 1)
        self._sock.setsockopt(zmq.REQ_CORRELATE, 1)
        self._sock.connect(endpoint)
        self.timeout = timeout

    def _call(self, request: Dict[str, Any]) -> Dict[str, Any]:
        self._sock.send(self._msgpack.encode(request))
        if not self._sock.poll(int(self.timeout * 1000)):
            raise TimeoutError(f"no answer from the index within {self.timeout} s")
        answer = self._msgpack.decode(self._sock.recv())
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            kind = answer.get("error", "bad_answer") if isinstance(answer, dict) else "bad_answer"
            message = answer.get("message", repr(answer)) if isinstance(answer, dict) else repr(answer)
            raise IndexQueryError(kind, message)
        return answer

    def query(
        self,
        tokens: Optional[Sequence[int]] = None,
        hashes: Optional[Sequence[int]] = None,
        early_exit: bool = False,
    ) -> Dict[str, Any]:
        """Scores of a request given by ``tokens`` or by chained ``hashes``."""
        if (tokens is None) == (hashes is None):
            raise ValueError("give either tokens or hashes")
        request: Dict[str, Any] = {"op": "query", "early_exit": bool(early_exit)}
        if tokens is not None:
            request["tokens"] = [int(t) for t in tokens]
        else:
            request["hashes"] = [int(h) for h in hashes]  # type: ignore[union-attr]
        return self._call(request)

    def stats(self) -> Dict[str, Any]:
        """The server's figures (workers, blocks, events, query latency, feeds)."""
        return self._call({"op": "stats"})

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()

    def __enter__(self) -> "IndexClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
