"""How the site stores its collected static files (``STORAGES["staticfiles"]``)."""

from servestatic.storage import CompressedManifestStaticFilesStorage


class StaticStorage(CompressedManifestStaticFilesStorage):
    """Hashed names, gzip and Brotli variants, and hashed names inside JavaScript modules.

    The inbox script imports its sibling modules (``import … from "./inbox-view.js"``):
    rewriting those imports to the hashed names too means a cached page never pairs
    a new script with an old module, and every module is cached as long as the page's
    script. All modules name each other the same way, so each still loads once.
    """

    support_js_module_import_aggregation = True
