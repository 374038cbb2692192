"""ml_runtime: the small runtime package installed as the last layer of every image.

It checks the image's runtime contract before the user's command starts, probes
the accelerator in a vendor-neutral way, selects devices and reports metrics.
Training code uses ``get_device()`` and ``get_gpu_metrics()`` (see ml_runtime.api).

Example:
    >>> import ml_runtime
    >>> ml_runtime.__version__
    '0.1.0'
"""

__version__ = "0.1.0"

from ml_runtime.api import get_device, get_gpu_metrics

__all__ = ["__version__", "get_device", "get_gpu_metrics"]
