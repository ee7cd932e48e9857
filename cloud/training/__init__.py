"""The cloud trainer: pipeline-parallel training after PipeDream on ``torch.distributed``.

Pure parts (``profiler``'s cache, ``partition``, ``schedules``) import no process group; the
mechanism (``comm``, ``runtime``, ``run``) runs one pipeline stage (or stage replica) per rank
under ``torchrun``. ``jobs`` is the small API that ``cloudd`` calls to launch and watch jobs.
Subpackages (``compression``, ``sync``, ``data``) describe themselves in their own docstrings.
"""
