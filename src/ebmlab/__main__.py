from ebmlab.cli import run

run()
