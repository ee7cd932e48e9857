"""``python -m cloud.ctl``: the ``cloudctl`` command."""

import sys

from cloud.ctl.main import main

sys.exit(main())
