import sys

from vedart.cli import main

sys.exit(main())
