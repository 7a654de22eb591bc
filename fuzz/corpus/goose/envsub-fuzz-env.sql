-- +goose Up
-- +goose ENVSUB ON
SELECT '${A}', '${U:1:3}', '${U:-2}', '${EMPTY:-d}', '${B-${A}}';
SELECT '${NOPE?missing}';
-- +goose ENVSUB OFF
-- +goose Down
SELECT $1;
