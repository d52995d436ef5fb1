from lara.cli import entry

entry()
