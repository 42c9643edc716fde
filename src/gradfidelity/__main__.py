import sys

from gradfidelity.cli import main

sys.exit(main())
