"""Interactive explorers for the notebooks (ipywidgets), each with a static default view.

In JupyterLab an explorer is a row of controls over an output area that redraws when a
control moves. Under papermill (`dsa-lab report`, notebook parameter `interactive=False`)
the same drawing function runs once with the default values, so the HTML report shows
what the explorer shows before anyone touches it.
"""
