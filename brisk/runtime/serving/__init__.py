"""Serving brisk on SGLang: the plugin, its algorithm options and the serving benchmark.

- :mod:`~brisk.runtime.serving.options` — :class:`BriskISDOptions`, the ``--dllm-algorithm-config``
  YAML of the ``BriskISD`` algorithm (no SGLang needed);
- :mod:`~brisk.runtime.serving.plugin` — ``register()``, the ``sglang.srt.plugins`` entry point:
  adds ``BriskISD`` to SGLang's dLLM algorithms, admits Qwen3-layout models with a mask token,
  and installs the DFlash reranking hook;
- :mod:`~brisk.runtime.serving.algorithm` — ``BriskISD``, a ``DllmAlgorithm`` around brisk's
  batched ISD step;
- :mod:`~brisk.runtime.serving.dflash` — the corrector over DFlash's Top-K draft candidates;
- :mod:`~brisk.runtime.serving.bench` — ``brisk bench serve``: the paper's serving sweep over
  ``sglang.benchmark.serving``, with paired ratios;
- :mod:`~brisk.runtime.serving.loopback` — a small OpenAI-compatible server with a known speed,
  which the sweep is tested against;
- :mod:`~brisk.runtime.serving.launch` — the command line and environment of a real SGLang
  server (CPU or CUDA) and a process handle that waits for it and stops it (``brisk serve``);
- :mod:`~brisk.runtime.serving.worker` — ``BriskISDWorker``, ISD as SGLang speculative algorithm
  ``BRISK_ISD`` (exact verification by brisk's step, KV of accepted slots only, block logs);
- :mod:`~brisk.runtime.serving.engine` — ``isd_engine``: SGLang's offline ``Engine`` with the
  same arguments as the server, for generating with ISD from Python without a port;
- :mod:`~brisk.runtime.serving.cpu` — the CPU stand-ins for SGLang's CUDA-only imports
  (``sgl_kernel``, ``torchvision``), loaded only for ``--device cpu``.

SGLang is an optional extra (``brisk[serving]``): only the plugin, algorithm and DFlash modules
import it, and importing :mod:`brisk` or this package imports nothing of it.
"""
