"""Models shared by the gateway and the cloud: architectures, numeric formats, ONNX export.

Invariant: importing ``models`` is cheap; torch is imported only by the submodules that need it,
so the gateway can use ``models`` without torch unless local training is enabled.
"""
