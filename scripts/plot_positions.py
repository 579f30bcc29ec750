"""Plot the positions a RePo head predicts for a text, with token labels (PNG). See `--help`."""

from olmo_repo.eval.plot_cli import plot_positions_main

if __name__ == "__main__":
    raise SystemExit(plot_positions_main())
