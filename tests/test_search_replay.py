"""Replay: strategies run against a recorded exhaustive run (a records bundle), and `tuneforge replay`."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuneforge.cli import main
from tuneforge.search import Budget
from tuneforge.search.replay import reached, recordings, replay
from tuneforge.store.record import BUNDLE_FORMAT, BUNDLE_VERSION, Record, read_records, write_bundle

from .search_fixtures import OPTIMUM, tiled_cost, tiled_space


def recorded_run(path: Path) -> Path:
    """An exhaustive run of the tiled space as records (a tenth of them failed builds), plus library calls (one
    without parameters, one with: cuBLAS's activation) and a second selection too small to search."""
    rows = []
    for i, config in enumerate(tiled_space()):
        failed = i % 10 == 3 and config != OPTIMUM
        rows.append(Record(key="sel-tiled", choice=f"c{i}", op="tiled", choice_name=f"tiled_{i}",
                           status="compile_error" if failed else "ok",
                           median_ms=None if failed else tiled_cost(config), params=dict(config),
                           inputs="float32[512x512]", created=time.time()))
    rows.append(Record(key="sel-tiled", choice="lib", op="tiled", choice_name="library", status="ok", median_ms=0.5))
    rows.append(Record(key="sel-tiled", choice="blas", op="tiled", choice_name="cublas", status="ok", median_ms=0.4,
                       params={"activation": "none"}, info={"family": "ExternChoice:cublas"}))
    rows += [Record(key="sel-small", choice=f"s{i}", op="small", choice_name=f"s{i}", status="ok",
                    median_ms=1.0 + i, params={"X": i}) for i in range(3)]
    write_bundle({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": time.time(),
                  "records": [r.to_json() for r in rows]}, path)
    return path


def test_a_recording_is_the_selection_s_configurations_and_their_times(tmp_path: Path) -> None:
    found = recordings(read_records(recorded_run(tmp_path / "run.json")))
    assert [r.key for r in found] == ["sel-tiled"]  # the small selection is no search problem
    recording, = found
    assert recording.size == 1320 and recording.best == 1.0  # the library calls are no configurations
    assert set(recording.space.names) == set(OPTIMUM)  # nor is cuBLAS's activation a parameter of the space
    assert sum(c == float("inf") for c in recording.costs.values()) == 132
    assert recording.evaluate([OPTIMUM]) == [1.0] and OPTIMUM in recording.space
    assert recording.space.count() == 1320


def test_replay_curves_show_a_guided_search_beating_random(tmp_path: Path) -> None:
    recording, = recordings(read_records(recorded_run(tmp_path / "run.json")))
    guided = replay(recording, "default", seeds=10, budget=Budget(fraction=0.15))
    blind = replay(recording, "random", seeds=10, budget=Budget(fraction=0.15))
    assert all(r.evaluations <= 198 for r in guided + blind)
    guided_curve, blind_curve = reached(guided, recording.best), reached(blind, recording.best)
    assert [c.tolerance for c in guided_curve] == [0.0, 0.01, 0.02, 0.05, 0.10]
    for curve in (guided_curve, blind_curve):  # a looser tolerance is reached no later
        assert all(a.median >= b.median for a, b in itertools.pairwise(curve))
    assert guided_curve[2].reached == 10 and guided_curve[2].median < 0.15 * 1320  # the target, here
    assert guided_curve[0].median < blind_curve[0].median


def test_the_replay_command_prints_a_table_per_selection(tmp_path: Path) -> None:
    path = recorded_run(tmp_path / "run.json")
    result = CliRunner().invoke(main, ["replay", str(path), "--strategy", "default", "--strategy", "random",
                                       "--seeds", "5", "--budget", "20%", "--batch", "4"])
    assert result.exit_code == 0, result.output
    assert "tiled (float32[512x512]): 1320 configurations, 1188 ok, best 1 ms" in result.output
    assert "to 2%" in result.output and "default" in result.output and "random" in result.output
    bad = CliRunner().invoke(main, ["replay", str(path), "--budget", "lots"])
    assert bad.exit_code != 0 and "cannot read 'lots'" in bad.output
    unknown = CliRunner().invoke(main, ["replay", str(path), "--strategy", "annealing"])
    assert unknown.exit_code != 0 and "unknown search strategy 'annealing'" in unknown.output
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": 0, "records": []}))
    none = CliRunner().invoke(main, ["replay", str(empty)])
    assert none.exit_code != 0 and "no selection with at least 8" in none.output


@pytest.mark.parametrize("strategy", ["coordinate_descent", "genetic"])
def test_replay_is_deterministic_per_seed(tmp_path: Path, strategy: str) -> None:
    recording, = recordings(read_records(recorded_run(tmp_path / "run.json")))
    first = replay(recording, strategy, seeds=3, budget=Budget(evaluations=60))
    again = replay(recording, strategy, seeds=3, budget=Budget(evaluations=60))
    assert [r.history for r in first] == [r.history for r in again]
    assert len({tuple(recording.space.key(c) for c, _ in r.history) for r in first}) == 3  # seeds differ


def test_a_gzip_compressed_bundle_is_read_as_it_is(tmp_path: Path) -> None:
    import gzip

    from tuneforge.store.record import RecordError

    plain = recorded_run(tmp_path / "run.json")
    packed = tmp_path / "run.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [r.to_json() for r in read_records(packed)] == [r.to_json() for r in read_records(plain)]
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed.read_bytes()[:200])
    with pytest.raises(RecordError, match="cannot be read"):
        read_records(cut)


def test_a_recording_by_build_walks_the_builds(tmp_path: Path) -> None:
    """Configurations that name one artifact are one point (the parameters they share), costing their best."""
    rows = []
    for i, config in enumerate(tiled_space()):
        build = f"art-{config['BM']}-{config['BN']}"  # UNROLL, BK and ORDER as runtime parameters
        rows.append(Record(key="sel", choice=f"c{i}", op="tiled", choice_name=f"t{i}", status="ok",
                           median_ms=tiled_cost(config), params=dict(config), info={"artifact": build}))
    path = tmp_path / "builds.json"
    write_bundle({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": 0.0,
                  "records": [r.to_json() for r in rows]}, path)
    by_build, = recordings(read_records(path), by_build=True)
    assert by_build.size == 33 and by_build.space.names == ("BM", "BN")  # the pairs within BM * BN <= 16384
    assert by_build.best == 1.0 and by_build.evaluate([{"BM": 64, "BN": 32}]) == [1.0]
    by_config, = recordings(read_records(path))
    assert by_config.size == 1320
    result = CliRunner().invoke(main, ["replay", str(path), "--by", "build", "--strategy", "default", "--seeds", "3"])
    assert result.exit_code == 0 and "33 builds, 33 ok" in result.output, result.output


SHIPPED = sorted((Path(__file__).parent / "data" / "spaces").glob("*.json.gz"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_the_default_strategy_meets_its_target_on_the_shipped_recordings(path: Path) -> None:
    """Issue 14's target, on recorded exhaustive GEMM runs (benchmarks/record_spaces.py): the default strategy comes
    within 2% of the recorded best using at most 15% of the configurations, median over 20 seeds."""
    recording, = recordings(read_records(path))
    results = replay(recording, "default", seeds=20, budget=Budget(fraction=0.3))
    within, = reached(results, recording.best, (0.02,))
    # avx2 128^3's best is 5.7% ahead of every other configuration: within 2% means finding that one (15.0%)
    assert within.median <= 0.15 * recording.size, (within.median, recording.size)


def test_recordings_ship_for_both_vector_widths_and_a_gpu() -> None:
    assert len(SHIPPED) >= 7 and {p.name.split("-")[1] for p in SHIPPED} == {"avx512", "avx2", "cuda"}


def test_a_replay_stops_each_run_at_the_recorded_best(tmp_path: Path) -> None:
    """Nothing after the best changes a run's curve: a random search over 1,320 points ends where it finds it."""
    recording, = recordings(read_records(recorded_run(tmp_path / "run.json")))
    results = replay(recording, "random", seeds=5)
    assert all(r.stopped == "target" and r.best_cost == recording.best for r in results)
    assert [r.evaluations for r in results] == [c for c in reached(results, recording.best, (0.0,))[0].evaluations]


def test_a_replay_gives_the_strategy_its_suggestions(tmp_path: Path) -> None:
    recording, = recordings(read_records(recorded_run(tmp_path / "run.json")))
    near = dict(OPTIMUM, UNROLL=1)  # a heuristic pick one step from the best
    hinted = replay(recording, "default", seeds=5, suggested=[near])
    assert all(r.history[0][0] == near for r in hinted)  # timed first, in place of the random samples
    step = len(recording.space.neighbours(near, 2))
    assert all(r.evaluations <= 1 + step for r in hinted)  # the best is among its first neighbours
    blind = replay(recording, "default", seeds=5)
    assert sum(r.evaluations for r in hinted) < sum(r.evaluations for r in blind)
