// Typed errors of file-backed datasets: a file or object that is missing or unreadable, and one
// whose contents do not match its format. Each names the source (path or nats-obj:// URL, with the
// line or row where it helps) and what to do about it.
import * as Schema from "effect/Schema"

/** A dataset source cannot be reached or read: a missing file, an empty glob, a missing bucket or object. */
export class DataSourceError extends Schema.TaggedError<DataSourceError>()("DataSourceError", {
  source: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `dataset source ${this.source}: ${this.reason}`
  }
}

/** A file's contents do not match its format (bad header, wrong column count, a value that is not a number). */
export class DataFormatError extends Schema.TaggedError<DataFormatError>()("DataFormatError", {
  source: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `malformed dataset file ${this.source}: ${this.reason}`
  }
}

/** A saved data position does not belong to this dataset (another file list, another chunking). */
export class DataPositionMismatch extends Schema.TaggedError<DataPositionMismatch>()("DataPositionMismatch", {
  dataset: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return (
      `cannot resume dataset "${this.dataset}" from the checkpoint's data position: ${this.reason}. ` +
      "The checkpoint was taken on other files or with other chunking options; resume with the same datasets, " +
      "or drop gradwire/data-position.json from the checkpoint to start the epoch over"
    )
  }
}
