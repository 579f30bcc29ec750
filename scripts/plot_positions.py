"""Plot the positions a RePo head predicts for a text, with token labels (PNG). See `--help`."""

from olmo_repo.cli.plot_positions import main

if __name__ == "__main__":
    raise SystemExit(main())
