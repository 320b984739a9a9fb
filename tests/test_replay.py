"""Replay and diff: a recorded task rerun from its request or a step, on another team
version, in process and over the API; two trajectories aligned by step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relaygraph.evals import diff_trajectories, read_trajectory
from relaygraph.runner import ReplayChanges, RequestRefused, ledger_for, replay_task, run_task
from relaygraph.store import LOCAL_PROJECT_ID
from relaygraph.team import load_team

from ._service import ServiceClient as Api
from ._service import auth
from .conftest import EXAMPLE_RELAY

RELAY = f"scripted:{EXAMPLE_RELAY}"

# Writer drafts; the researcher checks and hands the draft back to the writer; FINISH. The
# researcher's third turn is played only where its handoff is refused (team v2).
HANDBACK = {
    "supervisor": [
        {"route": {"next": "writer", "task": "Draft the note", "reason": "a draft first"}},
        {"route": {"next": "researcher", "task": "Check the draft", "reason": "facts"}},
        {"route": {"next": "FINISH", "task": "", "reason": "done"}},
    ],
    "researcher": [
        {"tool_calls": [{"name": "search_docs", "args": {"query": "checkpoint"}}]},
        {
            "tool_calls": [
                {
                    "name": "transfer_to_writer",
                    "args": {"task": "Fix the numbers", "reason": "the writer owns the note"},
                }
            ]
        },
        {"content": "Checked: the draft's numbers are off by one."},
    ],
    "writer": [{"content": "Draft: 40 checkpoints."}, {"content": "Note: 41 checkpoints."}],
}

TEAM = """
name = "handback"
[agents.researcher]
use = "builtin:researcher"
handoffs = {handoffs}
[agents.writer]
use = "builtin:writer"
"""


def team_versions(folder: Path) -> tuple[Path, Path]:
    """The handback team's two versions as files: in v1 the researcher may hand work to the
    writer, in v2 it may not."""
    v1, v2 = folder / "v1.toml", folder / "v2.toml"
    v1.write_text(TEAM.format(handoffs='["writer"]'), encoding="utf-8")
    v2.write_text(TEAM.format(handoffs="[]"), encoding="utf-8")
    return v1, v2


async def registered_handback(api: Api, scripts: Path) -> tuple[str, dict[str, Any]]:
    """A project ``acme`` with both versions of the handback team registered (as 1 and 2),
    and a task of it on version 1 that succeeded: its key and the task."""
    key = api.key("acme")
    for handoffs in ('["writer"]', "[]"):
        pushed = await api.client.put(
            "/v1/teams/handback", json={"toml": TEAM.format(handoffs=handoffs)}, headers=auth(key)
        )
        assert pushed.status_code == 201, pushed.text
    (scripts / "handback.json").write_text(json.dumps(HANDBACK), encoding="utf-8")
    spec = "scripted:handback.json"
    made = await api.submit(key, input="Write the note", team="handback", version=1, model=spec)
    original = await api.wait(made.json()["id"], key)
    assert original["status"] == "succeeded", original
    return key, original


def _steps(ledger: Any, task_id: str) -> list[tuple[str, str | None]]:
    return [
        (e.type, e.agent)
        for e in ledger.events_after(task_id)
        if e.type in ("route", "handoff", "agent_started")
    ]


def test_replay_from_the_request_and_from_a_middle_step(home: Path) -> None:
    original = run_task("When are checkpoints written?", model=RELAY, home=home)
    assert original.status == "succeeded"
    ledger = ledger_for(home)
    again = replay_task(original.task_id, home=home)
    middle = replay_task(original.task_id, ReplayChanges(from_step=2), home=home)
    for result, step in ((again, 0), (middle, 2)):
        assert result.status == "succeeded"
        assert result.answer == original.answer
        task = ledger.get_task(result.task_id, project_id=LOCAL_PROJECT_ID)
        assert task is not None
        assert (task.replay_of, task.from_step) == (original.task_id, step)
        assert task.thread_id != original.thread_id
    # From the request the whole trajectory runs again; from step 2 only the writer's visit.
    assert _steps(ledger, again.task_id) == _steps(ledger, original.task_id)
    assert _steps(ledger, middle.task_id) == [
        ("route", "supervisor"),
        ("agent_started", "writer"),
        ("route", "supervisor"),
    ]
    # The tool journal proves the first two steps' calls did not run again (the search and
    # the coder's program), while a replay from the request ran them.
    assert ledger.journaled_call(middle.task_id, "call_coder_1_0") is None
    assert ledger.journaled_call(again.task_id, "call_coder_1_0") is not None
    assert [c.tool for c in ledger.tool_calls(middle.task_id)] == ["save_artifact"]
    # The original is unchanged, and each replay's trajectory is the original's.
    first = ledger.get_task(original.task_id, project_id=LOCAL_PROJECT_ID)
    assert first is not None and first.replay_of is None and first.status == "succeeded"
    base = read_trajectory(ledger, first)
    diffs = []
    for result in (again, middle):
        replayed = ledger.get_task(result.task_id, project_id=LOCAL_PROJECT_ID)
        assert replayed is not None
        diffs.append(diff_trajectories(base, read_trajectory(ledger, replayed)))
    # The program ran again from the request, in another time: its run time is no
    # difference.
    for diff in diffs:
        assert diff.same, diff.to_json()["steps"]
    middle_task = ledger.get_task(middle.task_id, project_id=LOCAL_PROJECT_ID)
    assert middle_task is not None
    inherited = read_trajectory(ledger, middle_task)
    assert [s.inherited for s in inherited.steps] == [True, True, False]


def test_a_step_past_the_end_is_refused_naming_it(home: Path) -> None:
    original = run_task("When are checkpoints written?", model=RELAY, home=home)
    with pytest.raises(RequestRefused, match="from_step takes 0 to 3 \\(got 4\\)") as refused:
        replay_task(original.task_id, ReplayChanges(from_step=4), home=home)
    assert refused.value.field == "from_step"
    with pytest.raises(RequestRefused, match="from_step must be a whole number"):
        replay_task(original.task_id, ReplayChanges(from_step=-1), home=home)
    with pytest.raises(RequestRefused, match="no task 'nope'"):
        replay_task("nope", home=home)


def test_another_team_version_parts_where_the_handoff_changed(
    home: Path, tmp_path: Path, script: Any
) -> None:
    v1, v2 = team_versions(tmp_path)
    model = script(HANDBACK)
    original = run_task("Write the note", team=v1, model=model, home=home)
    assert original.status == "succeeded", original.stop_reason
    ledger = ledger_for(home)
    # On v2 the researcher may no longer hand work to the writer; from step 1 (the
    # writer's draft stands) the trajectories part at step 2, the researcher's visit.
    replayed = replay_task(
        original.task_id, ReplayChanges(from_step=1, team=load_team(v2)), home=home
    )
    first = ledger.get_task(original.task_id, project_id=LOCAL_PROJECT_ID)
    second = ledger.get_task(replayed.task_id, project_id=LOCAL_PROJECT_ID)
    assert first is not None and second is not None
    assert second.team is not None and second.team["digest"] != (first.team or {})["digest"]
    diff = diff_trajectories(read_trajectory(ledger, first), read_trajectory(ledger, second))
    assert diff.first_divergence == 2
    assert not diff.steps[0].differences and diff.steps[0].b is not None
    assert diff.steps[0].b.inherited
    assert "violations" in diff.steps[1].differences
    summary = diff.summary()
    assert summary["same"] is False and summary["steps"] == {"a": 3, "b": 2}
    assert not diff.answer_same


async def test_replay_and_diff_over_the_api(api: Api) -> None:
    key, other = api.key("acme"), api.key("globex")
    made = await api.client.post("/v1/tasks", json={"input": "When?"}, headers=auth(key))
    original = await api.wait(made.json()["id"], key)
    assert original["status"] == "succeeded"
    url = f"/v1/tasks/{original['id']}/replay"
    replayed = await api.client.post(url, json={"from_step": 2}, headers=auth(key))
    assert replayed.status_code == 202, replayed.text
    done = await api.wait(replayed.json()["id"], key)
    assert done["status"] == "succeeded" and done["answer"] == original["answer"]
    # Another project's task is absent to it, for a replay as for a diff.
    assert (await api.client.post(url, json={}, headers=auth(other))).status_code == 404
    cross = f"/v1/tasks/{original['id']}/diff/{done['id']}"
    assert (await api.client.get(cross, headers=auth(other))).status_code == 404
    diff = (await api.client.get(cross, headers=auth(key))).json()
    assert diff["summary"]["same"] is True and diff["summary"]["first_divergence"] is None
    assert diff["b"]["replay_of"] == original["id"] and diff["b"]["from_step"] == 2
    itself = f"/v1/tasks/{original['id']}/diff/{original['id']}"
    assert (await api.client.get(itself, headers=auth(key))).json()["summary"]["same"] is True
    # Bad bodies are refused naming the value.
    for body, field in (({"from_step": -1}, "from_step"), ({"from_step": 9}, "from_step")):
        bad = await api.client.post(url, json=body, headers=auth(key))
        assert bad.status_code == 422, bad.text
        assert field in json.dumps(bad.json())
    loosen = await api.client.post(
        url, json={"policy": {"team": {"max_agent_runs": 10_000}}}, headers=auth(key)
    )
    assert loosen.status_code == 422 and "loosens" in loosen.text


def test_eval_replay_reports_where_each_task_parts_and_gates(
    home: Path, tmp_path: Path, script: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from relaygraph.cli import main

    v1, v2 = team_versions(tmp_path)
    model = script(HANDBACK)
    ran = [run_task(f"Write note {i}", team=v1, model=model, home=home) for i in range(2)]
    assert {r.status for r in ran} == {"succeeded"}
    common = ["--home", str(home), "eval", "--replay", "--of-team", "handback"]
    # The same team again: every task routes the same way (the baseline).
    assert main([*common, "--out", str(tmp_path / "base"), "--min-same-rate", "1"]) == 0
    base = json.loads((tmp_path / "base" / "report.json").read_text())
    assert base["summary"]["same_routes"] == 2 and base["summary"]["diverged"] == []
    # On v2 both part at step 2 (the researcher's handoff), and regress against the baseline.
    code = main(
        [
            *common,
            "--team",
            str(v2),
            "--out",
            str(tmp_path / "v2"),
            "--baseline",
            str(tmp_path / "base"),
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "v2" / "report.json").read_text())
    assert {c["task_id"] for c in report["cases"]} == {r.task_id for r in ran}
    assert [c["first_divergence"] for c in report["cases"]] == [2, 2]
    assert [c["same_routes"] for c in report["cases"]] == [False, False]
    assert all(0 < c["answer_similarity"] < 1 for c in report["cases"])
    assert sorted(report["regressions"]) == sorted(r.task_id for r in ran)
    assert "route differently than in" in capsys.readouterr().err
    # A bad query names the value.
    assert main([*common, "--status", "done"]) == 2
    assert "status 'done'" in capsys.readouterr().err


def test_exported_tasks_are_golden_cases_their_own_runs_pass(home: Path, tmp_path: Path) -> None:
    from relaygraph.cli import main
    from relaygraph.evals import run_eval

    run_task("When are checkpoints written?", model=RELAY, home=home)
    out = tmp_path / "exported.jsonl"
    assert main(["--home", str(home), "evals", "export", "--out", str(out)]) == 0
    case = json.loads(out.read_text().splitlines()[0])
    assert case["expect"]["agents"] == ["researcher", "coder", "writer"]
    assert case["expect"]["handoffs"] == [["researcher", "coder"]]
    assert case["expect"]["tools_used"] == ["search_docs", "run_python", "save_artifact"]
    report = run_eval(out, home=home)
    assert report.metrics.pass_rate == 1.0


def test_bad_flags_are_refused_naming_the_value(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from relaygraph.cli import main

    original = run_task("When are checkpoints written?", model=RELAY, home=home)
    at = ["--home", str(home)]
    assert main([*at, "replay", original.task_id, "--from-step", "9"]) == 2
    assert "from_step takes 0 to 3 (got 9)" in capsys.readouterr().err
    assert main([*at, "replay", "no-such-task"]) == 2
    assert "no task 'no-such-task'" in capsys.readouterr().err
    missing = tmp_path / "v9.toml"
    assert main([*at, "replay", original.task_id, "--team", str(missing)]) == 2
    assert f"--team {str(missing)!r} is no team file" in capsys.readouterr().err
    assert main([*at, "diff", original.task_id, "nope"]) == 2
    assert "no task 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*at, "replay", original.task_id, "--from-step", "-1"])
    assert "expected a whole number of 0 or more, got '-1'" in capsys.readouterr().err
    # The diff of a task with itself, as JSON: no difference.
    assert main([*at, "diff", original.task_id, original.task_id, "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["summary"]["same"] is True and same["summary"]["steps_differing"] == 0


async def test_a_replay_on_a_registered_version_parts_where_its_handoffs_changed(
    api: Api,
    scripts: Path,
) -> None:
    key, original = await registered_handback(api, scripts)
    # Version 2 of the same team, from step 1: the writer's draft stands.
    replayed = await api.client.post(
        f"/v1/tasks/{original['id']}/replay", json={"version": 2, "from_step": 1}, headers=auth(key)
    )
    assert replayed.status_code == 202, replayed.text
    assert (
        replayed.json()["team"]["version"] == 2 and replayed.json()["replay_of"] == original["id"]
    )
    await api.wait(replayed.json()["id"], key)
    diff = (
        await api.client.get(
            f"/v1/tasks/{original['id']}/diff/{replayed.json()['id']}", headers=auth(key)
        )
    ).json()
    assert diff["summary"]["first_divergence"] == 2
    assert "violations" in diff["steps"][1]["differences"]
    assert diff["steps"][0]["b"]["inherited"] is True
    # A version the team does not have is refused naming it.
    missing = await api.client.post(
        f"/v1/tasks/{original['id']}/replay", json={"version": 7}, headers=auth(key)
    )
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "version"


async def test_the_operator_replays_a_projects_task_on_a_registered_version(
    api: Api,
    scripts: Path,
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from relaygraph.cli import main

    key, original = await registered_handback(api, scripts)
    at = ["--home", str(home)]
    # One task, forked after step 1 onto version 2 of the project's team, in its project.
    code = main(
        [*at, "replay", original["id"], "--from-step", "1", "--team", "handback@2", "--json"]
    )
    assert code == 0
    replayed = json.loads(capsys.readouterr().out)
    # The replay is acme's, like its original: not the CLI's own project's.
    assert ledger_for(home).get_task(replayed["task_id"], project_id=LOCAL_PROJECT_ID) is None
    got = await api.client.get(f"/v1/tasks/{replayed['task_id']}", headers=auth(key))
    assert got.json()["replay_of"] == original["id"] and got.json()["team"]["version"] == 2
    # The project's tasks on version 1, replayed on version 2 as an eval.
    assert (
        main(
            [
                *at,
                "eval",
                "--replay",
                "--project",
                "acme",
                "--of-team",
                "handback@1",
                "--out",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [c["task_id"] for c in report["cases"]] == [original["id"]]
    assert report["cases"][0]["same_routes"] is True
    assert main([*at, "replay", original["id"], "--team", "handback@9"]) == 2
    assert "'handback@9' is no team file, nor a team" in capsys.readouterr().err


def test_a_queued_replay_is_on_its_fork_when_any_runner_takes_it(home: Path) -> None:
    """The fork is on the replay's thread before the replay is recorded: a runner that takes
    queued tasks from the ledger (``serve --processes``) starts it from its request as any
    task, and it goes on from the fork."""
    from relaygraph.errors import ConfigError
    from relaygraph.runner import Intake, TaskRunner, submit_replay, team_of_record
    from relaygraph.runner._checkpoint import open_checkpointer

    original_run = run_task("When are checkpoints written?", model=RELAY, home=home)
    ledger = ledger_for(home)
    original = ledger.get_task(original_run.task_id, project_id=LOCAL_PROJECT_ID)
    assert original is not None
    team = team_of_record(original)
    queued = [
        submit_replay(
            original,
            ReplayChanges(from_step=2),
            team=team,
            policy=None,
            intake=Intake(ledger=ledger),
            home=home,
        ).task
        for _ in range(2)
    ]
    assert {task.status for task in queued} == {"queued"}
    runner = TaskRunner(ledger=ledger, home=home)
    result = runner.run(queued[0], {"request": queued[0].input}, only_from=("queued",))
    assert result.status == "succeeded"
    assert _steps(ledger, queued[0].id) == [
        ("route", "supervisor"),
        ("agent_started", "writer"),
        ("route", "supervisor"),
    ]
    # A replay whose fork is gone fails saying so, rather than running from its request.
    with open_checkpointer(home) as saver:
        saver.delete_thread(queued[1].checkpoint_thread)
    with pytest.raises(ConfigError, match="holds no checkpoint to go on from"):
        runner.run(queued[1], {"request": queued[1].input}, only_from=("queued",))


async def test_eval_replay_takes_a_registered_team_version(
    api: Api,
    scripts: Path,
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from relaygraph.cli import main

    key, original = await registered_handback(api, scripts)
    common = ["--home", str(home), "eval", "--replay", "--project", "acme"]
    common += ["--of-team", "handback@1"]
    # Version 2 of the project's team, named as `relaygraph replay --team` names it: the
    # researcher's handoff is refused there, so the task parts at step 2.
    out = tmp_path / "v2"
    assert main([*common, "--team", "handback@2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    (case,) = report["cases"]
    assert case["task_id"] == original["id"] and case["error"] is None
    assert (case["same_routes"], case["first_divergence"]) == (False, 2)
    replayed = await api.client.get(f"/v1/tasks/{case['replay_id']}", headers=auth(key))
    assert replayed.json()["team"]["version"] == 2
    capsys.readouterr()
    assert main([*common, "--team", "handback@9"]) == 2
    assert "'handback@9' is no team file, nor a team the tasks' project registered" in (
        capsys.readouterr().err
    )
