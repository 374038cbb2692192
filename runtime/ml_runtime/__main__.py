"""Entry point for ``python -m ml_runtime``.

Example:
    $ python -m ml_runtime probe --json
"""

import sys

from ml_runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
