"""Serving brisk on SGLang: the plugin, its algorithm options and the serving benchmark.

- :mod:`~brisk.runtime.serving.options` — :class:`BriskISDOptions`, the options of ``BRISK_ISD``,
  and the plugin config that carries an algorithm's options to SGLang (the served model's
  config key ``brisk``, set by ``--json-model-override-args``; no SGLang needed);
- :mod:`~brisk.runtime.serving.plugin` — ``register()``, the ``sglang.srt.plugins`` entry point:
  registers the speculative algorithm ``BRISK_ISD`` and installs the DFlash reranking and
  torch-native verify-attention hooks;
- :mod:`~brisk.runtime.serving.common` — what the worker and the DFlash hook share (the served
  model's heads for the corrector, request validation and keys, the block logger) and the
  launch-time checks of the model and the corrector against the options (no SGLang needed);
- :mod:`~brisk.runtime.serving.dflash` — the corrector over DFlash's Top-K draft candidates;
- :mod:`~brisk.runtime.serving.bench` — ``brisk bench serve``: the paper's serving sweep over
  ``sglang.benchmark.serving``; :mod:`~brisk.runtime.serving.bench_summary` its summary, paired
  ratios, tables and plot;
- :mod:`~brisk.runtime.serving.loopback` — a small OpenAI-compatible server with a known speed,
  which the sweep is tested against;
- :mod:`~brisk.runtime.serving.launch` — the command line and environment of a real SGLang
  server (CPU or CUDA, ``brisk serve``); :mod:`~brisk.runtime.serving.process` a process handle
  that waits for it and stops it;
- :mod:`~brisk.runtime.serving.chain_worker` — what both brisk algorithms' workers share: the
  chain verify, the prefill's refusals, SGLang's results, the TPF log;
- :mod:`~brisk.runtime.serving.worker` — ``BriskISDWorker``, ISD as SGLang speculative algorithm
  ``BRISK_ISD`` (exact verification by brisk's step, KV of accepted slots only, block logs);
- :mod:`~brisk.runtime.serving.drafter_worker` — ``BriskDrafterWorker``, a DFlash-format drafter
  verified by the served AR target as SGLang speculative algorithm ``BRISK_DRAFTER`` (the CPU
  included, where SGLang's DFLASH does not run); its options and the launch-time check of the
  drafter against the target in :mod:`~brisk.runtime.serving.drafter_options` (no SGLang needed);
- :mod:`~brisk.runtime.serving.engine` — ``isd_engine``: SGLang's offline ``Engine`` with the
  same arguments as the server, for generating with ISD from Python without a port;
- :mod:`~brisk.runtime.serving.cpu` — the CPU stand-ins for SGLang's CUDA-only imports
  (``sgl_kernel``, ``torchvision``), loaded only for ``--device cpu``.

SGLang is an optional extra (``brisk[serving]``): only the workers (``chain_worker`` among them)
import it at import time (the plugin and the DFlash hooks when SGLang calls them), and importing
:mod:`brisk` or this package imports nothing of it. (The dLLM algorithm ``BriskISD`` of
``--dllm-algorithm``, which SGLang 0.5.23's whole-block dLLM scheduler could not run, is retired
in favour of ``BRISK_ISD``.)
"""
