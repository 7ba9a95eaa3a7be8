DROP TABLE appservice_states;
