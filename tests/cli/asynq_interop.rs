//! Go asynq v0.26 and the generated worker on one queue (to be written).
