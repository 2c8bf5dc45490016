import sys

from sie_worker.cli import main

sys.exit(main())
