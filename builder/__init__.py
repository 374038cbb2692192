"""ml-image-builder: one build matrix for CUDA, ROCm, XPU and CPU container images."""

__version__ = "0.1.0"
