from vcppo.config.load import schema_markdown

print(schema_markdown())
