"""The studio's Gradio tabs, one module each, over personalize.studio.facade.Studio.

Every tab module has `build(studio, shared)`: it lays out the tab and binds its events to module-level
handlers (plain functions of the Studio and the widgets' values, testable without a server). `controls`
makes the components several tabs read (`Shared`); `common` holds the error handling and Markdown;
`figures` the plots. app.py's `build_app` lists the tab builders in page order.

May import: personalize.studio and everything below it (the tabs call the Studio façade; page text and
Markdown are here). Not eval or cli.
"""
