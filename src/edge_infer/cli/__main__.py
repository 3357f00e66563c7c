"""``python -m edge_infer.cli``: the ``edge-infer`` command."""
import sys

from edge_infer.cli import main

sys.exit(main())
