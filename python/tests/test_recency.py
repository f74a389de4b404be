"""The daemon's recency rule (`radixd serve --recency`) is visible to its
clients (`Client.recency`, read from the segment at connect) and to
`radixd stat`: the SGLang backends read it to log it and to warn when it
is not SGLang's (issue 37, item 3)."""

from __future__ import annotations

import subprocess

import pytest

import radixd
from conftest import radixd_bin


def _stat(name: str) -> str:
    out = subprocess.run(
        [radixd_bin(), "stat", name, "--interval", "0.01"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("flags, rule", [((), "exact"), (("--recency", "exact"), "exact"), (("--recency", "sglang"), "sglang")])
def test_a_client_and_stat_read_the_daemons_recency(flags, rule, start_daemon):
    d = start_daemon(*flags)
    with d.client() as c:
        assert c.recency == rule
    config = next(line for line in _stat(d.name).splitlines() if line.startswith("config"))
    assert config.endswith(", sglang recency") == (rule == "sglang"), config


def test_an_engine_and_a_daemon_of_one_rule_answer_alike(start_daemon):
    """The rule the client reads is the one the daemon runs: a split's lower
    half survives a partial eviction only under SGLang's rule."""
    for rule in ("exact", "sglang"):
        d = start_daemon("--recency", rule, page_size=1, capacity=16)
        with d.client() as c:
            e = radixd.Engine(1, 16, recency=c.recency)
            found = []
            for cache in (c, e):
                for tokens in ([1, 2, 3, 4], [9, 9]):
                    cache.insert(tokens, cache.alloc(len(tokens)))
                cache.match_prefix([1, 2])  # splits [1, 2 | 3, 4]
                assert cache.evict(2) == 2
                found.append([cache.match_prefix(t).len for t in ([1, 2, 3, 4], [9, 9])])
            # SGLang's rule: the split touched [3, 4], so [9, 9] goes; exact:
            # [3, 4] kept its insert's use, older than [9, 9]'s.
            want = [4, 0] if rule == "sglang" else [2, 2]
            assert found == [want, want], rule
