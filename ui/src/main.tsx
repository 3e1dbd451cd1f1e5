// Entry point: styles, the event stream, the app.
import './style.css'
import { render } from 'preact'
import { App } from './app'
import { connect } from './events'

connect()
render(<App />, document.getElementById('app')!)
