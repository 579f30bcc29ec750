"""Position explorer: a local web page and JSON API that show the position each token of a prompt gets in every
RePo layer and head, for one or two models side by side, with the analysis of `olmo_repo.eval.positions`.

    model.py   ExplorerModel: a model (an HF directory, or what `open_model` makes one of) loaded once; positions,
               tokens, analysis
    app.py     the FastAPI app (page, local plotly.js, /api/...), serving on 127.0.0.1, the static HTML export
    serve.py   what scripts/explore.py does: serve_explorer, export_page (input checks before any load)
    page/      index.html (Jinja2 template) and explorer.js (the plot, selectors and tables)

Needs the `explore` extra (FastAPI, uvicorn, plotly), which `make install` installs.
"""
