"""``python -m gnll``: the ``gnll`` command."""

from gnll.cli.main import app

if __name__ == "__main__":
    app(prog_name="gnll")
