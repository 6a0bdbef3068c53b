from tuneforge.cli import run

run()
