"""A site's cohort read from its OMOP Common Data Model database (OHDSI CDM v5.4), through SQL.

- :mod:`.cohort`: ``CohortSpec``, the TOML file that says how CDM rows become trajectories (entity, index date and
  time grid, actions from concept sets, contexts, statics, outcome, site) and the ``DatasetSpec`` it implies;
- :mod:`.cdm`: the CDM tables and columns the extraction reads, declared once as SQLAlchemy Core tables;
- :mod:`.connect`: a database named on the command line (a DuckDB file or a ``postgresql://`` URL) opened
  read-only, with the password only from the environment or the PostgreSQL password file;
- :mod:`.extract`: the checks (tables, columns, concept ids, units) and the extraction into the long-format table
  :func:`fcd_secure.data.preprocess.build_dataset` reads;
- :mod:`.synth`: a generated world's long tables written as an OMOP CDM instance (``fcd data export --format omop``).

The CDM is documented at https://ohdsi.github.io/CommonDataModel/cdm54.html (table and field names used here).
"""
