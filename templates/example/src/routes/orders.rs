//! The example slice's orders: `POST /orders` stores an order, its
//! `orderPlaced` event and its `orderReminderDue` for a day later in one
//! transaction; `GET /orders/{id}` shows the order, and whether the
//! `confirm` listener has confirmed it yet.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::events::order_placed::OrderPlaced;
use crate::events::order_reminder_due::OrderReminderDue;
use crate::startup::AppState;

/// The body of `POST /orders`.
#[derive(Debug, Deserialize)]
pub struct NewOrder {
    pub sku: String,
    pub quantity: i32,
}

/// An order, as the API shows it.
#[derive(Debug, Serialize)]
pub struct Order {
    pub id: Uuid,
    pub sku: String,
    pub quantity: i32,
    /// Whether the `confirm` listener has recorded the order's event.
    pub confirmed: bool,
}

/// `POST /orders`: 201 with the new order; 400 with `{"error": ...}` when
/// the body is not a valid order.
pub async fn place(
    State(state): State<AppState>,
    body: Result<Json<NewOrder>, JsonRejection>,
) -> Result<(StatusCode, Json<Order>), ApiError> {
    let Json(new) = body.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    let sku = new.sku.trim();
    if sku.is_empty() {
        return Err(ApiError::bad_request("`sku` must not be empty"));
    }
    if new.quantity < 1 {
        return Err(ApiError::bad_request("`quantity` must be 1 or more"));
    }
    let event = OrderPlaced {
        order_id: Uuid::now_v7(),
        sku: sku.to_string(),
        quantity: new.quantity,
    };
    state
        .transactor
        .run(async |tx| {
            sqlx::query("INSERT INTO orders (id, sku, quantity) VALUES ($1, $2, $3)")
                .bind(event.order_id)
                .bind(&event.sku)
                .bind(event.quantity)
                .execute(&mut *tx)
                .await?;
            kit::dispatch(&mut *tx, &event).await?;
            // Its reminder: stored now, its listeners run in 24 hours.
            let reminder = OrderReminderDue {
                order_id: event.order_id,
            };
            kit::dispatch_in(&mut *tx, &reminder, Duration::from_secs(24 * 60 * 60)).await?;
            Ok(())
        })
        .await
        .map_err(ApiError::internal)?;
    let order = Order {
        id: event.order_id,
        sku: event.sku,
        quantity: event.quantity,
        confirmed: false,
    };
    Ok((StatusCode::CREATED, Json(order)))
}

/// `GET /orders/{id}`: 200 with the order, 404 when there is none, 400 when
/// `id` is not a UUID.
pub async fn show(
    State(state): State<AppState>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<Order>, ApiError> {
    let Path(id) = id.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    let row: Option<(String, i32, bool)> = sqlx::query_as(
        "SELECT sku, quantity, \
             EXISTS (SELECT 1 FROM order_confirmations AS c WHERE c.order_id = o.id) \
         FROM orders AS o WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await
    .map_err(|err| ApiError::internal(err.into()))?;
    let (sku, quantity, confirmed) = row.ok_or(ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("there is no order {id}"),
    })?;
    Ok(Json(Order {
        id,
        sku,
        quantity,
        confirmed,
    }))
}

/// An error response: a status and `{"error": "<message>"}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// A failure of ours: logged in full, answered without details.
    fn internal(err: anyhow::Error) -> Self {
        tracing::error!(error = format!("{err:#}"), "request failed");
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "internal error".to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(serde_json::json!({ "error": self.message }));
        (self.status, body).into_response()
    }
}
