import sys

from lara.cli import main

sys.exit(main())
