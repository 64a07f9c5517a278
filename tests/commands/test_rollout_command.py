"""``draftwatch rollout start|status|promote|abort`` on a real database (a SQLite file and PostgreSQL).

The judged rollouts are made as tests/proxy/test_rollout.py makes them: records of both pools stored,
the judge run at the test's clock; the commands then read them as a user would.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete
from sqlalchemy.engine import Engine

from monitor.commands import rollout as command
from monitor.commands.main import build_parser, main
from monitor.proxy.rollout import abort, advance_rollouts, start_rollout
from monitor.store.models import RollupMinuteRow
from monitor.store.rollouts import CURRENT_DRAFTER, STATUSES, get_rollout, rollout_events, rollouts
from tests.proxy.test_rollout import CANDIDATE, INTERVAL, PROXY, interval_of, requests, rollout_settings, store
from tests.proxy.upstream import Upstream, serving
from tests.records import T0
from tests.serving import free_port, serve_process
from tests.store.candidates import wait_announced

Run = Callable[..., tuple[int, str, str]]
CANDIDATE_URL = "http://cand:8082"


@pytest.fixture
def run(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``draftwatch ARGS`` against ``engine``'s database with a candidate pool: (exit status, stdout, stderr)."""
    env = {
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "DRAFTWATCH_PROXY_UPSTREAM": "http://spec:8080",
        "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": CANDIDATE_URL,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DRAFTWATCH_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()

    def draftwatch(*args: str) -> tuple[int, str, str]:
        code = main(["rollout", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return draftwatch


def test_start_takes_the_settings_and_its_flags_override_them(
    run: Run, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTWATCH_ROLLOUT_STEPS", "10,100")
    monkeypatch.setenv("DRAFTWATCH_ROLLOUT_DRAFTER", "from-settings")
    monkeypatch.setenv("DRAFTWATCH_ROLLOUT_PER_WORKLOAD", "true")
    code, out, err = run("start", "--steps", "5,25,50,100", "--interval", "45m", "--drafter", "eagle3-v2",
                         "--no-per-workload", "--candidate", CANDIDATE_URL + "/")  # fmt: skip
    assert (code, err) == (0, "")
    (first,) = rollouts(engine)
    assert (first.drafter, first.steps, first.interval_s, first.per_workload, first.deployment, first.status) == (
        "eagle3-v2", (0.05, 0.25, 0.5, 1.0), 2700.0, False, "*", "running")  # fmt: skip
    assert (f"rollout {first.id} started: drafter eagle3-v2 on deployment '*' (candidate pool {CANDIDATE_URL}, "
            "proxy.candidate_upstream), steps 5,25,50,100 %, 45m a step\n") in out  # fmt: skip
    assert "step 1 sends 5% of the speculative requests to the candidate" in out
    assert "judges it every 1m (scheduler.rollout_interval)" in out
    for action in ("status", "promote", "abort"):
        assert f"draftwatch rollout {action} {first.id}" in out
    assert first.id is not None
    assert run("abort", str(first.id))[0] == 0
    # No flags: the rollout.* settings, the interval's default included.
    code, out, _ = run("start")
    assert code == 0 and "drafter from-settings" in out and "steps 10,100 %, 30m a step, per workload" in out
    second = rollouts(engine)[0]
    assert (second.drafter, second.steps, second.interval_s, second.per_workload) == (
        "from-settings", (0.1, 1.0), 1800.0, True)  # fmt: skip


def test_start_refusals_are_one_line_with_what_to_do_and_status_2(
    run: Run, engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("start")[0] == 0
    (running,) = rollouts(engine)
    cases = {
        (): f"rollout {running.id} is running on deployment '*': one rollout at a time; promote or abort it first "
        f"(draftwatch rollout abort {running.id}, or POST /v1/rollouts/{running.id}/abort)",
        ("--candidate", "http://elsewhere:9999"): "candidate='http://elsewhere:9999' is not in "
        "proxy.candidate_upstream (1 configured): a rollout only sends traffic to a configured candidate; add it there "
        "first",
        ("--drafter", "upstream"): "rollout.drafter='upstream': expected a name for the candidate drafter",
        ("--route", "2"): "route=2: no [[proxy.routes]] are configured",
    }
    for args, said in cases.items():
        code, out, err = run("start", *args)
        assert code == 2 and out == "", args
        assert err.startswith(f"draftwatch rollout start: {said}") and err.count("\n") == 1, err
    monkeypatch.delenv("DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM")
    code, _, err = run("start")
    assert code == 2
    assert err == (
        "draftwatch rollout start: deployment '*' has no candidate pool: no sidecar announced one in the last 3m and "
        "proxy.candidate_upstream is not set here; start the sidecars with serve --candidate-upstream URL "
        "(proxy.candidate_upstream, DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM: the same target served with the new drafter; "
        "the embedded decoder: serve --candidate-drafter, decoder.candidate), then start the rollout\n"
    )
    # A value the setting's own parser refuses is argparse's usage error, naming the flag.
    for flag, value, said in (("--steps", "50,25,100", "25 follows 50"), ("--steps", "5,50", "the last step to be 100"),
                              ("--interval", "soon", "expected a duration"), ("--route", "0", "'0'")):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            main(["rollout", "start", flag, value])
        assert exited.value.code == 2
        assert f"argument {flag}: " in (err := capsys.readouterr().err) and said in err, err
    assert [r.id for r in rollouts(engine)] == [running.id]  # nothing refused was stored


def start_beside_a_sidecar(
    run: Run, engine: Engine, tmp_path: Path, flags: tuple[str, ...], *steps: str, **env: str
) -> tuple[int, str, str]:
    """``rollout start STEPS --interval 30m --drafter eagle3-v2`` once a real ``serve FLAGS`` announced its pools."""
    db_url = engine.url.render_as_string(hide_password=False)
    sidecar = serve_process(tmp_path / "sidecar", db_url, free_port(), flags=flags, **env)
    try:
        wait_announced(engine)
        return run("start", *steps, "--interval", "30m", "--drafter", "eagle3-v2")
    finally:
        sidecar.terminate()
        sidecar.wait(30)


def test_the_readme_example_starts_on_the_candidate_pool_the_sidecar_serves(
    run: Run, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --upstream ... --candidate-upstream ... --baseline-upstream ...`` then ``rollout start --steps
    5,25,50,100 --interval 30m --drafter eagle3-v2``, as the README writes them (stand-in engines on real ports): the
    command's own settings name no candidate pool, the sidecar's flag does, and the sidecar announced it."""
    monkeypatch.delenv("DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM")
    assert run("start")[0] == 2  # no sidecar yet
    with serving(Upstream()) as spec, serving(Upstream()) as candidate, serving(Upstream()) as plain:
        flags = ("--upstream", spec, "--candidate-upstream", candidate, "--baseline-upstream", plain)
        code, out, err = start_beside_a_sidecar(run, engine, tmp_path, flags, "--steps", "5,25,50,100")
    assert (code, err) == (0, "")
    (r,) = rollouts(engine)
    assert (r.deployment, r.drafter, r.steps, r.current_drafters) == ("*", "eagle3-v2", (0.05, 0.25, 0.5, 1.0),
                                                                      ("upstream",))  # fmt: skip
    assert (f"rollout {r.id} started: drafter eagle3-v2 on deployment '*' (candidate pool {candidate}, "
            "proxy.candidate_upstream of 1 sidecar), steps 5,25,50,100 %, 30m a step\n") in out  # fmt: skip
    assert ("no requests with a decode time on deployment '*' in the last day: its steps cannot be timed; to be "
            "judged within one step a workload needs 600 requests per 30m at 5%, 120 at 25%, 60 at 50% (30 a side)"
            ) in out  # fmt: skip


def test_a_gateway_s_candidate_sidecar_announces_its_upstream_where_a_bare_start_finds_it(
    run: Run, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Gateway API path: the gateway splits the candidate's share off, and the recording sidecar in front of the
    candidate (``proxy.speculative = candidate``) is the only one that knows its URL."""
    monkeypatch.delenv("DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM")
    with serving(Upstream()) as candidate:
        code, out, err = start_beside_a_sidecar(run, engine, tmp_path, ("--upstream", candidate), "--steps", "50,100",
                                                DRAFTWATCH_PROXY_SPECULATIVE="candidate")  # fmt: skip
    assert (code, err) == (0, "")
    (r,) = rollouts(engine)
    assert (r.deployment, r.drafter, r.current_drafters) == ("*", "eagle3-v2", ("upstream",))
    assert (f"(candidate pool {candidate}, proxy.upstream of a candidate sidecar (proxy.speculative = candidate) "
            "of 1 sidecar)") in out  # fmt: skip


def traffic(engine: Engine, workload: str, per_5_minutes: int, start: datetime, hours: int) -> None:
    """The current drafter's requests of ``workload``, ``per_5_minutes`` every 5 minutes, ``hours`` from ``start``."""
    for k in range(12 * hours):
        store(
            engine, requests(workload, CURRENT_DRAFTER, 10.0, per_5_minutes, start + timedelta(minutes=5 * k), seed=k)
        )


def test_start_says_how_long_each_step_takes_at_the_traffic_seen_and_warns_where_none_decides(
    run: Run, engine: Engine
) -> None:
    """The issue's deployment: a workload served every 50 s never reaches 30 requests a side at a 5 % step."""
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
    traffic(engine, "prose", 80, start, 2)  # 480 a 30-minute step
    traffic(engine, "extract", 6, start, 2)  # 36
    before = datetime.now(UTC)
    code, out, err = run("start", "--steps", "5,25,50,100", "--interval", "30m", "--drafter", "eagle3-v2")
    after = datetime.now(UTC)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("at the traffic of the last 2")))
    assert lines[at].endswith(" (requests with a decode time), each step takes:")
    assert lines[at + 1].split() == ["workload", "per", "30m", "5%", "25%", "50%"]
    # The command counts the 2 hours' requests (prose's 1920, extract's 144) over the span from their first minute
    # to the time it read, between before and after: 2 hours and this minute's seconds, and the test's own. A count
    # per 30m is n * 1800 / span, 480 and 36 at 2 hours; prose's 30 a side at 5 % take 600 of its requests, 37.5
    # minutes at 2 hours (shown rounded up); extract reaches them at no step in time.
    short, long = ((t - start).total_seconds() for t in (before, after))

    def per_30m(n: int) -> list[str]:
        return [str(k) for k in range(round(n * 1800 / long), round(n * 1800 / short) + 1)]

    first_step = [f"{m}m" for m in range(math.ceil(600 * short / 1920 / 60), math.ceil(600 * long / 1920 / 60) + 1)]
    prose, extract = lines[at + 2].split(), lines[at + 3].split()
    few = extract.pop(1)
    assert prose.pop(1) in per_30m(1920) and few in per_30m(144), (prose, few, short, long)
    lasts = prose[1]
    assert lasts in first_step and prose == ["prose", lasts, "8m", "4m"]
    assert extract == ["extract", "never", "unjudged", "unjudged"]
    assert lines[at + 4].split() == ["the", "step", "lasts", lasts, "30m", "30m"]
    assert lines[at + 5] == ("  to be judged within one step a workload needs 600 requests per 30m at 5%, 120 at 25%, "
                             "60 at 50% (30 a side)")  # fmt: skip
    assert lines[at + 6 :] == [
        f"warning: extract ({few} per 30m) reaches no decision at 5%: 30 requests a side within 2h (a step and "
        "rollout.max_holds 3 more) needs 150 per 30m",
        "warning: extract is judged at no step at this traffic: it would be promoted with the rest, unjudged",
        "  to judge them: fewer steps at larger shares (--steps), a longer --interval, or a lower rollout.min_requests",
    ]
    (r,) = rollouts(engine)
    assert r.id is not None and run("abort", str(r.id))[0] == 0
    # Per workload, one step: the promotion waits for extract as long as its holds allow, then leaves it out.
    code, out, _ = run("start", "--steps", "5,100", "--interval", "30m", "--per-workload")
    assert code == 0
    assert ["the", "step", "lasts", "2h"] in [line.split() for line in out.splitlines()]
    assert "warning: extract is judged at no step at this traffic: it stays on the current drafter" in out
    # A deployment of extract alone rolls back at its first step: nothing reaches a decision there.
    assert run("abort", str(rollouts(engine)[0].id))[0] == 0
    with engine.begin() as conn:
        conn.execute(delete(RollupMinuteRow).where(RollupMinuteRow.workload == "prose"))
    code, out, _ = run("start", "--steps", "5,25,50,100", "--interval", "30m")
    assert code == 0 and ["the", "step", "lasts", "rollback"] in [line.split() for line in out.splitlines()]
    assert ("warning: at 5% no workload reaches 30 requests a side within 2h (a step and rollout.max_holds 3 more): "
            "the rollout would roll back there") in out  # fmt: skip


def test_status_lists_the_rollouts_newest_first_with_the_judges_newest_word(run: Run, engine: Engine) -> None:
    old = start_rollout(engine, PROXY, rollout_settings(), T0 - timedelta(hours=2))
    assert old.id is not None
    abort(engine, old.id, T0 - timedelta(hours=1), "p99 up")
    r = start_rollout(engine, PROXY, rollout_settings(), T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 9.0)})
    (advanced,) = advance_rollouts(engine, rollout_settings(), T0 + INTERVAL + timedelta(seconds=1))
    assert advanced.kind == "advanced"
    judged = get_rollout(engine, r.id)
    assert judged is not None
    copy = judged.judgement["workloads"]["copy"]
    speed = next(m for m in copy["metrics"] if m["metric"] == "decode_speed")

    code, out, err = run("status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"rollout {r.id}  running  step 2 of 3: 50% of the speculative requests to {CANDIDATE}"
    assert "drafter ngram-greedy on deployment '*', steps 10,50,100 %, 10m a step; started 2026-03-01T12:00:00" in out
    assert "newest judgement, requests of 2026-03-01T12:00:00 .. 2026-03-01T12:10:01:" in out
    row = next(line for line in lines if line.startswith("  copy "))
    assert row.split()[:3] == ["copy", "pass", "100"], row
    assert f"{speed['ratio']:.2f}x [{speed['ci'][0]:.2f}, {speed['ci'][1]:.2f}]" in row
    assert row.split()[-3:] == [str(copy["n_candidate"]), str(copy["n_current"]), "50%"], row
    assert any(line.startswith("  story ") and " pass " in line for line in lines)
    assert "reason: started" not in out  # a running rollout's events tell its story, not how it started
    # The older, aborted rollout comes after, with its reason; then the count.
    assert out.index(f"rollout {old.id}  aborted  ended at step 1 of 3") > out.index(f"rollout {r.id}  running")
    assert "  never judged\n  reason: p99 up" in out
    assert lines[-1] == "2 rollout(s)"

    code, out, _ = run("status", "--status", "aborted")
    assert code == 0 and f"rollout {old.id}  aborted" in out and f"rollout {r.id} " not in out
    code, out, _ = run("status", "--json")
    assert code == 0 and json.loads(out) == {"rollouts": [x.to_json() for x in rollouts(engine)]}
    assert json.loads(out)["rollouts"][0]["judgement"]["workloads"]["copy"]["outcome"] == "pass"


def test_status_of_one_rollout_shows_its_events_as_a_timeline(run: Run, engine: Engine) -> None:
    settings = rollout_settings(per_workload=True)
    r = start_rollout(engine, PROXY, settings, T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (kept,) = advance_rollouts(engine, settings, T0 + timedelta(minutes=5, seconds=1))
    assert (kept.kind, kept.workload) == ("kept", "story")

    code, out, err = run("status", str(r.id))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    story = next(line for line in lines if line.startswith("  story "))
    assert story.split()[:2] == ["story", "fail"] and " 0%  kept on the current drafter; decode_speed fail" in story
    copy = next(line for line in lines if line.startswith("  copy "))
    assert copy.split()[1] == "pass" and copy.endswith(" 10%")
    assert "  events (2):" in lines
    timeline = lines[lines.index("  events (2):") + 2 :]
    assert timeline[0].split()[:4] == ["2026-03-01T12:00:00", "started", "1/3", "10%"]
    assert timeline[0].endswith("started: steps 10%, 50%, 100%, 600 s a step")
    assert timeline[1].split()[:5] == ["2026-03-01T12:05:01", "kept", "1/3", "10%", "story"]
    assert "story kept on the current drafter (failed): decode_speed fail" in timeline[1]

    code, out, _ = run("status", str(r.id), "--json")
    stored = get_rollout(engine, r.id)
    assert stored is not None and code == 0
    events = [e.to_json() for e in rollout_events(engine, rollout_id=r.id)]
    assert json.loads(out) == {**stored.to_json(), "events": events}
    assert [e["kind"] for e in json.loads(out)["events"]] == ["started", "kept"]
    assert run("status", "999") == (2, "", "draftwatch rollout status: no rollout 999: draftwatch rollout status "
                                           "lists them\n")  # fmt: skip


def test_promote_and_abort_by_hand(run: Run, engine: Engine) -> None:
    assert run("start", "--drafter", "eagle3-v2")[0] == 0
    (r,) = rollouts(engine)
    code, out, err = run("promote", str(r.id))
    assert (code, err) == (0, "")
    assert out.startswith(f"rollout {r.id} promoted: eagle3-v2 serves every workload of deployment '*'\n")
    assert f"then: draftwatch rollout abort {r.id}" in out
    promoted = get_rollout(engine, r.id or 0)
    assert promoted is not None and promoted.status == "promoted" and promoted.share("chat") == 1.0
    assert run("promote", str(r.id)) == (2, "", f"draftwatch rollout promote: rollout {r.id} is promoted: only a "
                                                "running one can be promoted\n")  # fmt: skip
    code, out, err = run("abort", str(r.id), "--reason", "p99 went up")
    assert (code, err) == (0, "")
    assert out == (f"rollout {r.id} aborted (p99 went up): every request of deployment '*' goes to the current drafter "
                   "again\n")  # fmt: skip
    aborted = get_rollout(engine, r.id or 0)
    assert aborted is not None and (aborted.status, aborted.reason, aborted.share("chat")) == ("aborted", "p99 went up",
                                                                                                0.0)  # fmt: skip
    assert [e.kind for e in rollout_events(engine, rollout_id=r.id)] == ["started", "promoted", "aborted"]
    assert run("abort", str(r.id)) == (2, "", f"draftwatch rollout abort: rollout {r.id} is aborted: only a running "
                                              "or promoted one can be aborted\n")  # fmt: skip
    for action in ("promote", "abort"):
        assert run(action, "999") == (2, "", f"draftwatch rollout {action}: no rollout 999: draftwatch rollout "
                                             "status (GET /v1/rollouts) lists them\n")  # fmt: skip
    # The default reason, and an abort of a running rollout.
    assert run("start")[0] == 0
    newest = rollouts(engine)[0]
    assert run("abort", str(newest.id))[0] == 0
    assert (get_rollout(engine, newest.id or 0) or newest).reason == "aborted by hand"


def test_each_action_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    said = {
        (): "The scheduler's rollout job judges each step per workload",
        ("start",): "Each flag overrides its rollout.* setting",
        ("status",): "decode speed (the candidate's over the current drafter's",
        ("promote",): "make the candidate the deployment's --upstream",
        ("abort",): "a new rollout may start",
    }
    for path, phrase in said.items():
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["rollout", *path, "--help"])
        assert exited.value.code == 0
        assert phrase in " ".join(capsys.readouterr().out.split()), path
    assert main(["rollout"]) == 2 and "ROLLOUT_COMMAND" in capsys.readouterr().out
    assert command.STATUSES == STATUSES  # spelled out there so that --help loads no database layer
