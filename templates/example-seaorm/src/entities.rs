//! The example's tables as SeaORM entities (`sea-orm-cli generate entity`
//! writes these from the database).

/// The `orders` table.
pub mod order {
    use sea_orm::entity::prelude::*;

    /// One order.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "orders")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: Uuid,
        pub sku: String,
        pub quantity: i32,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The `order_confirmations` table: one row per confirmed order's event.
pub mod confirmation {
    use sea_orm::entity::prelude::*;

    /// One confirmation, keyed by the event that caused it.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_confirmations")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub event_id: Uuid,
        pub order_id: Uuid,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The `order_reminders` table: one row per reminded order's event.
pub mod reminder {
    use sea_orm::entity::prelude::*;

    /// One reminder, keyed by the event that caused it.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "order_reminders")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub event_id: Uuid,
        pub order_id: Uuid,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
