"""The GGUF door (brisk.runtime.gguf, ``brisk convert gguf``) on a tiny Llama GGUF
(tests/runtime/tiny_gguf.py: what llama.cpp writes for a Llama, q and k in its rotary layout).

The reference is transformers' own reading of the same file: the converted checkpoint must hold
the same weights and give the same logits, and its tokenizer the file's ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from brisk.cli import main
from brisk.runtime.gguf import (
    SOURCE_FILE,
    checkpoint_dir,
    convert_gguf,
    read_gguf_header,
    supported_architectures,
)
from tests.runtime.tiny_gguf import (
    Tiny,
    hf_weights,
    llama_cpp_permute,
    vocabulary,
    write_gguf,
)

PROMPT = "the cat sat on the mat is what <|im_end|> he is"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Llama in F32 with its own LM head, and in Q4_1 with tied embeddings."""
    root = tmp_path_factory.mktemp("gguf")
    f32, q41 = root / "f32" / "tiny.gguf", root / "q41" / "tiny-Q4_1.gguf"
    for path in (f32, q41):
        path.parent.mkdir()
    write_gguf(f32, tied=False)
    write_gguf(q41, quant="Q4_1")
    return {"F32": f32, "Q4_1": q41}


def transformers_reads(file: Path, dtype: str = "float32") -> tuple[object, object]:
    """transformers' own reading of the GGUF: the reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        file.parent, gguf_file=str(file), dtype=getattr(torch, dtype)
    )
    return model.eval(), AutoTokenizer.from_pretrained(file.parent, gguf_file=str(file))


def saved(out: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)


@pytest.mark.parametrize(
    ("kind", "dtype"),
    [
        pytest.param("F32", "float32", id="F32-float32"),
        pytest.param("Q4_1", "float32", id="Q4_1-float32"),
        pytest.param("Q4_1", "bfloat16", id="Q4_1-bfloat16"),
    ],
)
def test_the_checkpoint_is_transformers_own_reading_of_the_file(
    files: dict[str, Path], kind: str, dtype: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import torch

    out = convert_gguf(files[kind], tmp_path / "model", dtype=dtype)
    said = capfd.readouterr().err.splitlines()  # brisk's line alone: no bar, no warning
    if kind == "F32":
        assert said == []
    else:
        assert said == [f"brisk: dequantizing Q4_1, Q8_0 weights of tiny-Q4_1.gguf to {dtype}"]
    ours, tokenizer = saved(out)
    reference, _ = transformers_reads(files[kind], dtype)
    assert ours.dtype == getattr(torch, dtype)
    theirs = reference.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = ours(ids).logits, reference(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6 if dtype == "float32" else 0)
    assert not hasattr(ours.config, "quantization_config")


def test_llama_cpp_rotary_layout_is_undone(files: dict[str, Path], tmp_path: Path) -> None:
    """The F32 file's q and k come back in transformers' layout: the weights written, exactly."""
    import torch

    written = hf_weights(Tiny(), len(vocabulary()), tied=False)
    ours, _ = saved(convert_gguf(files["F32"], tmp_path / "model"))
    state = ours.state_dict()
    for name, value in written.items():
        assert torch.equal(state[name], torch.from_numpy(value)), name
    permuted = llama_cpp_permute(written["model.layers.0.self_attn.q_proj.weight"], Tiny().heads)
    assert not torch.equal(
        state["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(permuted)
    )


def test_the_tokenizer_has_the_files_ids(files: dict[str, Path], tmp_path: Path) -> None:
    out = convert_gguf(files["Q4_1"], tmp_path / "model")
    _, tokenizer = saved(out)
    _, reference = transformers_reads(files["Q4_1"])
    tokens = vocabulary()
    assert len(tokenizer) == len(tokens)
    assert tokenizer.convert_ids_to_tokens(list(range(len(tokens)))) == tokens
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.pad_token_id == 2
    assert tokenizer.unk_token_id == 0
    ids = tokenizer(PROMPT).input_ids
    assert ids == reference(PROMPT).input_ids
    assert 2 in ids  # the control token is one id, not pieces
    assert tokenizer.decode(ids) == PROMPT
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    config = (out / "config.json").read_text()
    assert '"eos_token_id": 2' in config
    assert '"bos_token_id": 1' in config
    assert '"eos_token_id": 2' in (out / "generation_config.json").read_text()
    assert '"architecture": "llama"' in (out / SOURCE_FILE).read_text()


def test_a_wrong_eos_from_the_converter_is_set_from_the_file(
    files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """transformers issue #31630: older converters set EOS from BOS. Such a tokenizer (and
    config) is corrected from the file's tokenizer.ggml.eos_token_id, and the fix said."""
    import brisk.runtime.gguf as door

    load = door._load

    def faulty(source: Path, dtype: object) -> tuple[object, object]:
        model, tokenizer = load(source, dtype)
        tokenizer.eos_token = tokenizer.bos_token
        model.config.eos_token_id = model.generation_config.eos_token_id = 1
        return model, tokenizer

    monkeypatch.setattr(door, "_load", faulty)
    out = tmp_path / "model"
    assert main(["convert", "gguf", str(files["F32"]), str(out)]) == 0
    fixes = [line for line in capfd.readouterr().err.splitlines() if "eos" in line]
    assert fixes == [
        "brisk: tiny.gguf: the converted tokenizer's eos token was id 1; set to the file's "
        "'<|im_end|>' (id 2)",
        "brisk: tiny.gguf: the config's eos_token_id was 1; set to the file's 2",
        "brisk: tiny.gguf: the generation config's eos_token_id was 1; set to the file's 2",
    ]
    _, tokenizer = saved(out)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert '"eos_token_id": 2' in (out / "config.json").read_text()
    assert '"eos_token_id": 2' in (out / "generation_config.json").read_text()


def test_a_tokenizer_that_shifts_ids_is_refused(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import brisk.runtime.gguf as door

    header = read_gguf_header(files["F32"])
    tokens = list(header.tokens)
    tokens[100], tokens[101] = tokens[101], tokens[100]
    monkeypatch.setattr(door, "read_gguf_header", lambda f: replace_tokens(header, tokens))
    with pytest.raises(
        ValueError, match=r"disagrees with the file's vocabulary at 2 of 284 ids \(first: id 100"
    ):
        convert_gguf(files["F32"], tmp_path / "model")
    assert not (tmp_path / "model").exists()
    assert list(tmp_path.iterdir()) == []


def replace_tokens(header: object, tokens: list[str]) -> object:
    import dataclasses

    return dataclasses.replace(header, tokens=tuple(tokens))  # type: ignore[type-var]


def test_the_command_line_door(
    files: dict[str, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``brisk convert gguf`` writes a checkpoint brisk's loader runs (with a MASK id: the file
    has none)."""
    from brisk.runtime.loader import load_model

    out = tmp_path / "deep" / "model"
    assert main(["convert", "gguf", str(files["Q4_1"]), str(out), "--dtype", "float32"]) == 0
    printed = capfd.readouterr().out
    assert printed.startswith(f"wrote {out}: llama, ")
    assert "284-token tokenizer" in printed
    loaded = load_model(out, device="cpu", dtype="float32", mask_token_id=3, announce=False)
    assert loaded.mask_token_id == 3
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.tokenizer.eos_token_id == 2


def test_an_empty_out_directory_is_taken(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    assert convert_gguf(files["F32"], out) == out
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def truncated(at: float) -> object:
    def write(files: dict[str, Path], path: Path) -> Path:
        data = files["F32"].read_bytes()
        path.write_bytes(data[: int(len(data) * at)] if at < 1 else data[: int(at)])
        return path

    return write


def garbage(files: dict[str, Path], path: Path) -> Path:
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    return path


def rwkv6(files: dict[str, Path], path: Path) -> Path:
    write_gguf(path, arch="rwkv6")
    return path


def q8_1(files: dict[str, Path], path: Path) -> Path:
    write_gguf(path, tensor_type="Q8_1")
    return path


def no_tokenizer(files: dict[str, Path], path: Path) -> Path:
    write_gguf(path, tokenizer=False)
    return path


def missing(files: dict[str, Path], path: Path) -> Path:
    return path


BAD = [
    pytest.param(truncated(0.6), "is truncated or corrupt", id="truncated-in-the-weights"),
    pytest.param(truncated(300), "is truncated or corrupt", id="truncated-in-the-header"),
    pytest.param(truncated(2), "is not a GGUF file", id="two-bytes"),
    pytest.param(garbage, "is not a GGUF file", id="garbage"),
    pytest.param(rwkv6, "architecture 'rwkv6' is not one transformers reads", id="rwkv6"),
    pytest.param(q8_1, "tensor type Q8_1 has no dequantizer", id="Q8_1"),
    pytest.param(no_tokenizer, "holds no tokenizer", id="no-tokenizer"),
    pytest.param(missing, "no such file", id="missing"),
]


@pytest.mark.parametrize(("make", "says"), BAD)
def test_bad_input_is_one_line_naming_the_file(
    files: dict[str, Path],
    make: object,
    says: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    bad = make(files, tmp_path / "bad.gguf")  # type: ignore[operator]
    out = tmp_path / "model"
    assert main(["convert", "gguf", str(bad), str(out)]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"brisk: error: {bad}")
    assert says in line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["bad.gguf"] if bad.exists() else [])


def test_an_out_that_is_not_empty_is_refused(
    files: dict[str, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["convert", "gguf", str(files["F32"]), str(out)]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert (
        line
        == f"brisk: error: {out} exists and is not empty: the conversion writes a new directory"
    )
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_the_supported_architectures_are_transformers_causal_lms() -> None:
    names = supported_architectures()
    assert {"llama", "mistral", "qwen2", "qwen3", "qwen2moe", "qwen3moe"} <= set(names)
    assert not {"rwkv6", "t5", "umt5", "general", "tokenizer"} & set(names)


def test_checkpoint_dir_converts_a_gguf_once(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import brisk.runtime.gguf as door

    monkeypatch.setenv("BRISK_CACHE", str(tmp_path / "cache"))
    assert checkpoint_dir(tmp_path) == tmp_path  # a directory passes through
    first = checkpoint_dir(files["Q4_1"])
    assert first.parent == tmp_path / "cache" / "gguf"
    assert first.name.startswith("tiny-Q4_1-")
    assert (first / "config.json").is_file()

    def again(*args: object, **kwargs: object) -> Path:
        raise AssertionError("converted twice")

    monkeypatch.setattr(door, "convert_gguf", again)
    assert checkpoint_dir(files["Q4_1"]) == first


def test_checkpoint_dir_names_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRISK_CACHE", str(tmp_path / "cache"))
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(ValueError, match=r"^--checkpoint: .*notes.txt is neither a checkpoint"):
        checkpoint_dir(notes, where="--checkpoint")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(10))
    with pytest.raises(ValueError, match=r"^--model: .*bad.gguf is truncated or corrupt"):
        checkpoint_dir(bad)
    assert not (tmp_path / "cache" / "gguf").exists() or not any(
        (tmp_path / "cache" / "gguf").iterdir()
    )


def test_brisk_decode_takes_a_gguf_file_as_its_model(
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The loader's door: ``--model tiny.gguf`` decodes as the converted directory does (plain
    decoding: the file defines no MASK token), converting once into the cache."""
    import json

    from brisk.cli import main

    monkeypatch.setenv("BRISK_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT}) + "\n")

    def decode(model: Path, name: str) -> list[int]:
        out = tmp_path / f"{name}.jsonl"
        argv = ["decode", "--model", str(model), "--prompts", str(prompts), "--plain"]
        assert main([*argv, "--max-new-tokens", "8", "--out", str(out), "--no-progress"]) == 0
        return list(json.loads(out.read_text())["output_ids"])

    from_file = decode(files["Q4_1"], "file")
    converted = tmp_path / "converted"
    assert main(["convert", "gguf", str(files["Q4_1"]), str(converted)]) == 0
    assert from_file == decode(converted, "dir")
    assert len(from_file) == 8
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "gguf").iterdir()] == ["tiny"]
    capsys.readouterr()
    assert main(["decode", "--model", str(tmp_path / "none.gguf"), "--prompts", str(prompts)]) == 2
    assert "--model: " in capsys.readouterr().err
