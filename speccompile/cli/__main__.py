"""``python -m speccompile.cli``."""
from speccompile.cli.main import main

main()
