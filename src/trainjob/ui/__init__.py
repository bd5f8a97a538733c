"""``trainjob ui``: a local web dashboard for jobs of either backend.

The job list (status, nodes x processes, progress, age, live), a page per job (spec, events, per-node and
per-rank logs that follow, the metrics ``trainjob.torch.report`` recorded drawn as curves, several runs
overlaid, restarts and the failure's root cause) and suspend, resume and delete buttons that ask first.

Served by uvicorn (ASGI) with a Starlette app (:mod:`.server`) on 127.0.0.1; the pages are plain HTML with a
little JavaScript (``static/``), curves drawn by Plotly, whose bundle is served from the installed ``plotly``
package. Needs the ``ui`` extra: ``pip install 'trainjob[ui]'``::

    from trainjob.ui.server import serve
    serve(LocalBackend(), port=8470)
"""
