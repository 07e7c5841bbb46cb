"""Ablation evaluation: the per-checkpoint numbers agree with their definitions and the table has
the paper's shape (the intervals across seeds are tested with their home,
tests/mechanism/test_stats.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from brisk.experiments import (
    CheckpointEval,
    evaluate_checkpoint,
    markdown_table,
    plot_summaries,
    summarize,
)
from brisk.experiments.evaluate import Decoding, TimedCorrector
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.task import TaskConfig, make_split
from brisk.worlds.arithmetic.tokenizer import char_tokenizer
from tests.runtime.graders import GRADER


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def fake(arm: str, seed: int, tpf: float) -> CheckpointEval:
    return CheckpointEval(
        arm, seed, 10, 0.9, 0.15, 2.0, tpf, tpf + 1, 100.0, 30, 10, (10, 8), (8, 6)
    )


def test_summaries_table_and_plot(tmp_path: Path) -> None:
    evals = [fake("base", s, 3.0 + 0.1 * s) for s in range(3)]
    evals += [fake("brisk", s, 3.9 + 0.1 * s) for s in range(3)]
    summaries = summarize(evals)
    assert [s.arm for s in summaries] == ["base", "brisk"]
    assert summaries[1].metrics["tpf_run"].mean == pytest.approx(4.0)
    labels = {"base": ("Base", "–"), "brisk": ("Self-gen. (corr.)", "D")}
    table = markdown_table(summaries, labels, ("Training data", "W."), baseline="base")
    lines = table.splitlines()
    assert lines[0].startswith("| Training data | W. | Acc. (%) | Reject (%) |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert lines[3].endswith("| 3 | +29.0 % |")  # 4.0 / 3.1 − 1
    assert "90.0 [90.0, 90.0]" in lines[2]
    assert plot_summaries(summaries, tmp_path / "arms.png").stat().st_size > 0
    with pytest.raises(ValueError, match="baseline: no arm named 'x'"):
        markdown_table(summaries, baseline="x")
    with pytest.raises(ValueError, match="seed"):
        summarize([fake("a", 0, 3.0), fake("a", 0, 3.1)])


def test_table_names_the_arms_whose_grader_raised() -> None:
    import dataclasses

    clean = [fake("base", s, 3.0) for s in range(2)]
    raised = [dataclasses.replace(fake("brisk", s, 4.0), grader_errors=s + 1) for s in range(2)]
    assert "Grader errors" not in markdown_table(summarize(clean))
    table = markdown_table(summarize(clean + raised))
    assert table.splitlines()[-1] == "Grader errors (answers counted wrong): brisk 3."


def test_evaluation_decodes_in_batches_of_batch_size(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch_size = 80 over 100 problems decodes batches of 80 and 20 (decode's own default of
    64 used to split them into 64 + 16 + 20), and tok/s is measured at that batch size."""
    from brisk.runtime.isd import loop

    sizes: list[int] = []
    init = loop._Batch.__init__

    def record(
        self: loop._Batch,
        backbone: object,
        ctx: object,
        logger: object,
        prompts: list[list[int]],
        *args: object,
    ) -> None:
        sizes.append(len(prompts))
        init(self, backbone, ctx, logger, prompts, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop._Batch, "__init__", record)
    problems = make_split(TaskConfig.tiny(), "test", 100, seed=0)
    evaluate_checkpoint(
        checkpoint,
        [p.prompt for p in problems],
        [p.answer for p in problems],
        arm="base",
        seed=0,
        decoding=Decoding(stride=4, max_new_tokens=4, batch_size=80),
    )
    assert sizes == [80, 20]


def test_checkpoint_numbers_follow_their_definitions(checkpoint: Path) -> None:
    problems = make_split(TaskConfig.trivial(), "test", 12, seed=0)
    prompts, answers = [p.prompt for p in problems], [p.answer for p in problems]
    d = Decoding(stride=4, temperature=1.0, max_new_tokens=16, batch_size=5)
    a = evaluate_checkpoint(checkpoint, prompts, answers, arm="base", seed=0, decoding=d)
    b = evaluate_checkpoint(checkpoint, prompts, answers, arm="base", seed=0, decoding=d)
    c = evaluate_checkpoint(checkpoint, prompts, answers, arm="base", seed=1, decoding=d)
    assert a.problems == 12
    assert len(a.reached) == 3
    assert a.tpf_run == pytest.approx(a.output_tokens / a.forwards)
    assert a.rejection == pytest.approx(1 - sum(a.accepted) / sum(a.reached))
    assert 0 <= a.accuracy <= 1
    # the same seed replays the same uniforms per problem (batching aside); another does not
    assert (a.output_tokens, a.forwards, a.reached) == (b.output_tokens, b.forwards, b.reached)
    assert (a.output_tokens, a.forwards, a.reached) != (c.output_tokens, c.forwards, c.reached)
    with pytest.raises(ValueError, match="answers: expected 12"):
        evaluate_checkpoint(checkpoint, prompts, answers[:3], arm="base", seed=0, decoding=d)


def test_the_head_is_timed_without_touching_the_callers_object(checkpoint: Path) -> None:
    """The corrector's selection time is recorded (head_s > 0, so tokens/s without it is the
    larger) by a stand-in: the caller's head keeps its class's own ``select``. Head-off, the
    negative control, records none."""
    head = Corrector(CorrectorConfig.small(64, len(char_tokenizer()), M=3, K=8))
    select = head.select
    problems = make_split(TaskConfig.trivial(), "test", 6, seed=0)
    prompts, answers = [p.prompt for p in problems], [p.answer for p in problems]
    d = Decoding(stride=4, temperature=1.0, max_new_tokens=8)
    on = evaluate_checkpoint(
        checkpoint, prompts, answers, arm="head", seed=0, decoding=d, corrector=head
    )
    assert "select" not in vars(head)
    assert head.select == select
    assert type(head) is Corrector
    assert on.head_s > 0
    assert on.tokens_per_s_net > on.tokens_per_s
    off = evaluate_checkpoint(checkpoint, prompts, answers, arm="head", seed=0, decoding=d)
    assert off.head_s == 0


def test_timed_corrector_adds_up_the_selections_only() -> None:
    class Head:
        config = "the head's config"

        def select(self, seconds: float) -> str:
            time.sleep(seconds)
            return "chosen"

        def __call__(self, seconds: float) -> str:
            time.sleep(seconds)
            return "refined"

    timed = TimedCorrector(Head())
    assert [timed.select(0.02), timed.select(0.03)] == ["chosen", "chosen"]
    assert timed(0.05) == "refined"  # a shadow run's teacher-forced call: not the selection
    assert 0.05 <= timed.seconds < 0.1
    assert timed.config == "the head's config"


def test_grader_errors_are_counted_in_the_evaluation_and_its_summary(checkpoint: Path) -> None:
    """A grader that raises on odd answers: exactly that many errors (counted wrong), the
    first one's message kept, and the arm's summary adds them up over seeds."""
    problems = make_split(TaskConfig.trivial(), "test", 10, seed=0)
    prompts, answers = [p.prompt for p in problems], [p.answer for p in problems]
    odd = sum(int(a) % 2 for a in answers)
    assert 0 < odd < len(answers)
    d = Decoding(stride=4, max_new_tokens=4)
    evals = [
        evaluate_checkpoint(
            checkpoint, prompts, answers, arm="base", seed=s, decoding=d, grader=GRADER
        )
        for s in (0, 1)
    ]
    assert [e.grader_errors for e in evals] == [odd, odd]
    assert "cannot grade answer" in str(evals[0].first_grader_error)
    assert evals[0].to_dict()["grader_errors"] == odd
    (summary,) = summarize(evals)
    assert summary.grader_errors == 2 * odd
    assert summary.to_dict()["grader_errors"] == 2 * odd
    control = evaluate_checkpoint(
        checkpoint, prompts, answers, seed=0, arm="base", decoding=d
    )  # the default grader raises on none
    assert (control.grader_errors, control.first_grader_error) == (0, None)
