"""`runwatch ui`: the web view (HTTP server, SVG charts, static pages)."""
