"""``python -m edge_llm``: the same as the ``edge-llm`` command."""

import sys

from edge_llm.cli.main import main

sys.exit(main())
