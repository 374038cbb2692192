"""ml_runtime: the small runtime package installed as the last layer of every image.

It checks the image's runtime contract before the user's command starts, probes
the accelerator in a vendor-neutral way, selects devices and reports metrics.

Example:
    >>> import ml_runtime
    >>> ml_runtime.__version__
    '0.1.0'
"""

__version__ = "0.1.0"
