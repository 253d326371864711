"""Unity Catalog's Delta API v1.0 (Managed Tables Specification v1.0) over the Delta service: `models` its request
bodies, `rules` what it checks and answers (pure), `proposals` what it hands the table actors, `service` the
`DeltaV1` the routes call, `errors` the outcomes its error model names, `columns` its column shape."""
