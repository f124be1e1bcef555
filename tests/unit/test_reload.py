"""``reload``: a file's splits and mirrors applied while serving, or refused changing nothing; audited either way."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
from openengine_gateway.config import AnalysisSection, Config, MirrorSection, SplitSection, load_config
from openengine_gateway.core.callers import Caller
from openengine_gateway.engines import EngineSet
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.reload import HangupReload, RouteReloader, SignalCaller, route_changes

from tests.fakes import FakeBackend, engine_set

ENGINES = """
[[engines]]
backend = "mock"
served_model_name = "a"

[[engines]]
backend = "mock"
served_model_name = "b"
"""
OPERATOR = Caller("operator", peer="ipv4:10.0.0.7:53122")


def _routes(a: int = 3, b: int = 1, *, mirror: str = "") -> str:
    return f'\n[[splits]]\nname = "ab"\nengines = {{ a = {a}, b = {b} }}\n{mirror}'


class Served:
    """A config file, the engines it started, and the reloader over them."""

    def __init__(self, path: Path, text: str, *, command_line: bool = False) -> None:
        self.path = path
        path.write_text(text)
        started = load_config(path)
        self.engines: EngineSet = engine_set((FakeBackend(), "a"), (FakeBackend(), "b"), (FakeBackend(), "c"))
        self.engines.reroute(started.splits, started.mirrors)  # as the gateway does when it starts
        self.reloader = RouteReloader(self.engines, path, started, command_line=command_line)

    def weights(self) -> list[dict[str, int]]:
        return [split.engines for split in self.engines.routes.splits]


def _audit(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "openengine_gateway.audit"]


def test_a_changed_weight_applies_and_says_what_changed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "openengine_gateway.audit")
    served = Served(tmp_path / "plugins.toml", ENGINES + _routes(3, 1))
    served.path.write_text(ENGINES + _routes(1, 3))
    reloaded = served.reloader.reload(OPERATOR)
    assert reloaded.changes == ("split 'ab': weight of a 3 -> 1, weight of b 1 -> 3",)
    assert served.weights() == [{"a": 1, "b": 3}]
    assert reloaded.routes is served.engines.routes
    assert _audit(caplog) == [
        f"audit: reload of routes from {served.path}: split 'ab': weight of a 3 -> 1, weight of b 1 -> 3 "
        "by token 'operator' from ipv4:10.0.0.7:53122"
    ]
    assert served.reloader.reload(OPERATOR).summary == "no change"


@pytest.mark.parametrize(
    ("edited", "reason"),
    [
        ("[[splits]\nname = 'ab'", "not valid TOML"),
        (ENGINES + _routes(0, 0), "at least one engine needs a weight above 0"),
        (ENGINES + '\n[[splits]]\nname = "ab"\nengines = { a = 1, nope = 1 }\n', "nope"),
        (ENGINES + _routes(mirror='\n[[mirrors]]\nname = "a"\nshadow = "a"\n'), r"mirrors\[0\]"),
        (ENGINES.replace('"b"', '"bee"') + _routes(), r"\[\[engines\]\] 1 \(bee, changed\)"),
        (ENGINES + '[[engines]]\nbackend = "mock"\nserved_model_name = "c"\n' + _routes(), r"2 \(c, added\)"),
        (
            "[plugins]\nallow = ['mock']\n" + ENGINES + _routes(),
            r"changed since the gateway started: \[plugins\] allow;",
        ),
        (
            "[backends.mock]\nseed = 1\n" + ENGINES + _routes(),
            r"\[backends.mock\]; engines start only at startup, so restart the gateway",
        ),
    ],
    ids=[
        "bad TOML",
        "invalid split",
        "unknown engine",
        "bad mirror",
        "engine changed",
        "engine added",
        "plugins",
        "backends",
    ],
)
def test_a_refused_reload_changes_nothing_and_is_audited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, edited: str, reason: str
) -> None:
    caplog.set_level(logging.INFO, "openengine_gateway.audit")
    served = Served(tmp_path / "plugins.toml", ENGINES + _routes(3, 1))
    before = served.engines.routes
    served.path.write_text(edited)
    with pytest.raises(ConfigurationError, match=reason):
        served.reloader.reload(OPERATOR)
    assert served.engines.routes is before
    (line,) = _audit(caplog)
    assert line.startswith(f"audit: reload of routes from {served.path} refused: ")
    assert line.endswith("by token 'operator' from ipv4:10.0.0.7:53122") and "\n" not in line


def test_engines_from_the_command_line_read_only_the_files_routes(tmp_path: Path) -> None:
    served = Served(tmp_path / "plugins.toml", _routes(3, 1), command_line=True)
    served.path.write_text("[backends.mock]\nseed = 1\n" + ENGINES + _routes(2, 2))
    assert served.reloader.reload(OPERATOR).changes == ("split 'ab': weight of a 3 -> 2, weight of b 1 -> 2",)


def test_a_gateway_started_without_a_file_refuses_a_reload(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "openengine_gateway.audit")
    reloader = RouteReloader(engine_set((FakeBackend(), "a")), None, Config(), command_line=True)
    with pytest.raises(ConfigurationError, match="started without a configuration file"):
        reloader.reload(OPERATOR)
    assert _audit(caplog)[0].startswith("audit: reload of routes refused: the gateway was started without")


def test_gateway_keys_changed_in_the_file_are_reported_as_not_applied(tmp_path: Path) -> None:
    served = Served(tmp_path / "plugins.toml", ENGINES + _routes())
    served.path.write_text("[gateway]\nport = 6000\nmax_in_flight = 8\n" + ENGINES + _routes())
    assert served.reloader.reload(OPERATOR).changes == (
        "[gateway] max_in_flight, port changed: not applied, read at the next start",
    )


def test_added_removed_and_changed_splits_and_mirrors_are_each_one_line(tmp_path: Path) -> None:
    served = Served(
        tmp_path / "plugins.toml",
        ENGINES + _routes(1, 1, mirror='\n[[mirrors]]\nname = "a"\nshadow = "c"\npercent = 10\n'),
    )
    before = served.engines.routes
    after = served.engines.reroute(
        [
            SplitSection(name="ab", engines={"a": 1, "c": 2}, sticky=["cache_salt"]),
            SplitSection(name="bc", aliases=["x"], engines={"b": 1, "c": 1}),
        ],
        [MirrorSection(name="b", shadow="c", max_in_flight=4)],
    )
    assert route_changes(before, after) == [
        "split 'ab': c added with weight 2, b removed (weight 1), sticky metadata.session, cache_salt -> cache_salt",
        "split 'bc' added: weights b 1, c 1; sticky metadata.session, cache_salt; aliases x",
        "mirror 'a' -> 'c' removed",
        "mirror 'b' -> 'c' added: 100% of requests, at most 4 in flight",
    ]
    changed = served.engines.reroute(after.splits, [after.mirrors[0].model_copy(update={"percent": 5.5})])
    assert route_changes(after, changed) == ["mirror 'b' -> 'c': percent 100 -> 5.5"]


def test_sighup_refusals_are_logged_and_one_while_starting_applies_once_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    served = Served(tmp_path / "plugins.toml", ENGINES + _routes(3, 1))
    hangup = HangupReload()
    served.path.write_text(ENGINES + _routes(1, 1))
    hangup()  # before serving: kept for later
    assert served.weights() == [{"a": 3, "b": 1}]
    hangup.serving(served.reloader)
    assert served.weights() == [{"a": 1, "b": 1}]
    assert "by SIGHUP from the operator" in _audit(caplog)[-1]
    served.path.write_text("not toml [")
    hangup()  # refused: logged, never raised
    assert served.weights() == [{"a": 1, "b": 1}]
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "SIGHUP: routes not reloaded, the old ones still serve" in warning[0].getMessage()
    assert SignalCaller().describe() == "SIGHUP from the operator"


def test_a_splits_analysis_added_paused_resumed_changed_and_removed_is_said(tmp_path: Path) -> None:
    served = Served(tmp_path / "plugins.toml", ENGINES + _routes(1, 1))
    analysis = AnalysisSection(baseline="a", candidate="b")
    states = [
        None,
        analysis,
        analysis.model_copy(update={"paused": True}),
        analysis,
        analysis.model_copy(update={"steps": [50, 100]}),
        None,
    ]
    tables = [
        served.engines.reroute([SplitSection(name="ab", engines={"a": 1, "b": 1}, analysis=s)], []) for s in states
    ]
    assert [route_changes(before, after) for before, after in itertools.pairwise(tables)] == [
        ["split 'ab': analysis added (a canary starts)"],
        ["split 'ab': analysis paused"],
        ["split 'ab': analysis resumed"],
        ["split 'ab': analysis changed (its canary starts again)"],
        ["split 'ab': analysis removed (its canary stops)"],
    ]
